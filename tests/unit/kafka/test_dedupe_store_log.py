"""The dedupe store without RocksDB's write-ahead log: what a clean stop and a crash keep.

Each case runs Faust's real RocksDB store (rocksdict) in a subprocess, since
``pipeline.kafka.faust_edge`` patches Faust globally, and reopens its folder in another.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.disk import tiny_tmpfs
from support.subprocess_python import last_json, run_python

_SETUP = """
import asyncio, glob, json, os, sys
from types import SimpleNamespace
import faust
from faust.types import TP
from pipeline.kafka import faust_edge
from pipeline.worker.dedupe import store_memory

app = faust.App("log-test", broker="kafka://127.0.0.1:1", store="rocksdb://",
                datadir={datadir!r})
table = app.Table("dedupe", key_type=bytes, value_type=bytes, partitions=2,
                  options=store_memory(4))  # 1 MiB memtables: a few thousand writes flush
CHANGELOG = "log-test-dedupe-changelog"
VALUE = bytes(1700)  # about a stored 384-float result

def wal_bytes():
    return sum(os.path.getsize(p) for p in glob.glob({datadir!r} + "/**/*.log", recursive=True))
"""

_WRITE = """
offsets = {{0: -1, 1: -1}}

def send(topic, key, value, partition, on_delivery):
    offsets[partition] += 1  # delivered at once, at the partition's next offset
    on_delivery(None, SimpleNamespace(partition=lambda: partition,
                                      offset=lambda: offsets[partition]))

async def main():
    store = faust_edge.ChangelogStore(table, send, wal={wal})
    early = None
    for i in range({n}):
        faust_edge.in_partition_of(
            SimpleNamespace(partition=i % 2), lambda: store.__setitem__(b"k%06d" % i, VALUE))
        if i % 100 == 99:
            store.flush_offsets()
        if i == 399:  # 680 KB written, within the first 1 MiB memtable: none flushed
            early = wal_bytes()
    store.flush_offsets()
    print(json.dumps({{"wal_bytes": early, "offsets": offsets}}), flush=True)
    if {crash}:
        os._exit(9)  # no close, no flush: what a SIGKILL leaves
    await table.data.stop()  # Faust's own stop: its databases dropped, so closed

asyncio.run(main())
"""

_READ = """
async def main():
    data = table.data
    out = {{}}
    for p in (0, 1):
        db = data._db_for_partition(p)
        keys = [k for k in range(p, {n}, 2) if db.get(b"k%06d" % k) is not None]
        out[p] = {{"persisted": data.persisted_offset(TP(CHANGELOG, p)), "keys": keys}}
    print(json.dumps(out))

asyncio.run(main())
"""


def _run(code: str) -> Any:
    done = run_python(code)
    assert done.returncode in (0, 9), done.stderr  # 9: the writer killed itself
    return last_json(done)


def _write(datadir: Path, *, n: int, wal: bool, crash: bool) -> Any:
    setup = _SETUP.format(datadir=str(datadir))
    return _run(setup + _WRITE.format(n=n, wal=wal, crash=crash))


def _read(datadir: Path, *, n: int) -> Any:
    return _run(_SETUP.format(datadir=str(datadir)) + _READ.format(n=n))


def test_stored_results_skip_the_log_and_a_clean_stop_keeps_every_one(tmp_path: Path) -> None:
    """3,000 results of 1.7 KB: with the log off (the default) the store's log files
    stay near empty, where with it on they hold every result not yet flushed (the
    first 400 here); after Faust's stop every entry and the last persisted offset of
    each partition are read back."""
    n = 3000
    unlogged = _write(tmp_path / "off", n=n, wal=False, crash=False)
    logged = _write(tmp_path / "on", n=n, wal=True, crash=False)
    assert unlogged["wal_bytes"] < 64 * 1024
    assert logged["wal_bytes"] > 1700 * 400
    back = _read(tmp_path / "off", n=n)
    for p in ("0", "1"):
        assert back[p]["keys"] == list(range(int(p), n, 2))
        assert back[p]["persisted"] == unlogged["offsets"][p] == n // 2 - 1


def test_a_crash_keeps_a_prefix_so_the_persisted_offset_never_runs_ahead(
    tmp_path: Path,
) -> None:
    """Killed without a close after 6,000 unlogged writes (several memtables flushed):
    in each partition every entry up to the persisted offset that survived is there,
    so Faust's recovery, which replays the changelog after that offset, restores
    the rest. (Entry k of a partition went out at changelog offset k // 2.)"""
    n = 6000
    _write(tmp_path, n=n, wal=False, crash=True)
    back = _read(tmp_path, n=n)
    survived = 0
    for p in ("0", "1"):
        persisted = back[p]["persisted"]
        if persisted is None:
            continue
        survived += 1
        upto = [k for k in range(int(p), n, 2) if k // 2 <= persisted]
        assert set(upto) <= set(back[p]["keys"])
    assert survived, "no memtable was flushed: the case proves nothing"


_FULL_DISK = """
def send(topic, key, value, partition, on_delivery):
    pass

async def main():
    store = faust_edge.ChangelogStore(table, send, stall_limit_s=2.0)  # the default: no log
    token = SimpleNamespace(partition=0)
    faust_edge.in_partition_of(token, lambda: store.__setitem__(b"first", b"v"))
    with open(os.path.join({datadir!r}, "ballast"), "wb") as f:  # the disk fills up
        try:
            f.write(bytes(4 * 1024 * 1024))
        except OSError:
            pass
    for i in range(20_000):
        try:
            faust_edge.in_partition_of(token, lambda: store.__setitem__(b"k%06d" % i, VALUE))
        except Exception as exc:
            print(json.dumps({{"failed_at": i, "error": str(exc)}}))
            return
    print(json.dumps({{"failed_at": None, "error": ""}}))

asyncio.run(main())
"""


def test_without_the_log_a_full_disk_still_fails_a_put_at_the_next_flush(tmp_path: Path) -> None:
    """The disk fills up under an unlogged store: puts go on into the memtable until it
    must be flushed, then one fails with the disk's error, which stops the worker as a
    logged put's failure does (``test_faults.py``'s disk-full test keeps the log, where
    the first put fails). With 1 MiB memtables that is within a few thousand results.
    Whether it fails with the flush's error or after waiting out the write stall that
    RocksDB holds while it recovers from the full disk (it waited for free space, the
    put with it, before ``stall_limit_s``) depends on which comes first: both happen."""
    with tiny_tmpfs(tmp_path / "disk", size="2m") as data:
        setup = _SETUP.format(datadir=str(data))
        out = _run(setup + _FULL_DISK.format(datadir=str(data)))
    assert out["failed_at"] is not None, "20,000 unlogged puts on a full disk all succeeded"
    assert 0 < out["failed_at"] < 2 * 1024 * 1024 // 1700 + 100
    stalled = "stalled the dedupe store's writes for 2 s" in out["error"]
    assert "No space left on device" in out["error"] or stalled, out["error"]


_STALLED = """
import time

def send(topic, key, value, partition, on_delivery):
    pass

async def main():
    store = faust_edge.ChangelogStore(table, send, stall_limit_s=0.5)
    token = SimpleNamespace(partition=0)
    faust_edge.in_partition_of(token, lambda: store.__setitem__(b"first", b"v"))
    # Writes stop once two flushed memtables wait in level 0, which is never compacted
    # here: a stall that lasts (as RocksDB's recovery from a full disk does).
    table.data._db_for_partition(0).set_options({{
        "level0_file_num_compaction_trigger": "100",
        "level0_slowdown_writes_trigger": "2",
        "level0_stop_writes_trigger": "2",
    }})
    for i in range(20_000):
        started = time.monotonic()
        try:
            faust_edge.in_partition_of(token, lambda: store.__setitem__(b"k%06d" % i, VALUE))
        except Exception as exc:
            print(json.dumps({{"failed_at": i, "error": str(exc),
                               "waited_s": time.monotonic() - started}}))
            return
    print(json.dumps({{"failed_at": None, "error": "", "waited_s": 0}}))

asyncio.run(main())
"""


def test_a_put_in_a_write_stall_fails_after_the_stall_limit_instead_of_waiting_on(
    tmp_path: Path,
) -> None:
    """RocksDB stops writes for good (level 0 full, never compacted): a put waits the
    stall out for ``stall_limit_s``, then fails saying so and how much disk is free,
    where RocksDB's own put would hold the worker's event loop until writes resumed."""
    setup = _SETUP.format(datadir=str(tmp_path))
    out = _run(setup + _STALLED.format())
    assert out["failed_at"] is not None, "20,000 puts went through a stopped store"
    assert "stalled the dedupe store's writes for 0.5 s" in out["error"], out["error"]
    assert "bytes free under" in out["error"]
    assert out["waited_s"] >= 0.5


_AFTER_STOP = """
sent = []

def send(topic, key, value, partition, on_delivery):
    sent.append(key)

async def main():
    store = faust_edge.ChangelogStore(table, send)
    token = SimpleNamespace(partition=0)
    faust_edge.in_partition_of(token, lambda: store.__setitem__(b"before", b"v"))
    await table.data.stop()  # as the table's stop does (the store is its child service)
    faust_edge.in_partition_of(token, lambda: store.__setitem__(b"after", b"v"))
    store.flush_offsets()
    print(json.dumps({{"reopened": sorted(table.data._dbs), "sent": [k.decode() for k in sent],
                       "after": repr(store.get(b"after")), "stopped": store.stopped}}))

asyncio.run(main())
"""


def test_a_write_after_the_stores_stop_goes_to_the_changelog_without_reopening_it(
    tmp_path: Path,
) -> None:
    """A result stored after Faust stopped the table (the worker's last answers come
    after it) is sent to the changelog only: Faust would open the partition's
    database again for it, and nothing would close it."""
    out = _run(_SETUP.format(datadir=str(tmp_path)) + _AFTER_STOP.format())
    assert out["reopened"] == []
    assert out["sent"] == ["before", "after"]
    assert out["after"] == "None"
