"""The dedupe store's bounds: RocksDB drops expired stored results at compaction, in
the store the worker's own app opens (reads alone would only hide them), and holds a
bounded amount in memory however many distinct results it stores.

The changelog side (``Retention.changelog_config`` applied on a real broker) is
tests/kafka/test_dedupe_live.py; the broker deletes a closed segment only at its
retention check (every 5 minutes by default), too slow to wait for in a test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.subprocess_python import last_json, run_python

from pipeline.errors import ConfigurationError
from pipeline.kafka.faust_edge.store import MEMTABLE_FILTER_RATIO
from pipeline.settings import DedupeSettings, Settings
from pipeline.worker.dedupe import BLOOM_BITS_PER_KEY, store_memory


def _run(code: str) -> dict[str, Any]:
    """Run ``code`` in a Python of its own (a Faust app per test); its last line, parsed."""
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = last_json(done)
    return result


def test_expired_stored_results_leave_rocksdb_at_compaction(tmp_path: Path) -> None:
    """The worker's app (TTL 1 s): 200 results stored, then 3 s later unreadable but
    still in RocksDB; one more stored; a compaction removes the 200 and keeps the new one."""
    code = f"""
        import json, time
        from types import SimpleNamespace
        from pipeline.app import create_app
        from pipeline.kafka import faust_edge
        from pipeline.settings import Settings
        from pipeline.worker.dedupe import TABLE_NAME, Retention, StoredResults

        settings = Settings.from_env({{
            "PIPELINE_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
            "PIPELINE_WORKER_APP_ID": "ttl-test",
            "PIPELINE_WORKER_DATA_DIR": {str(tmp_path)!r},
            "PIPELINE_DEDUPE_TTL_S": "1",
        }})
        app = create_app(settings)
        table = app.tables[TABLE_NAME]
        store = faust_edge.ChangelogStore(table, lambda *args: None)
        results = StoredResults(store, retention=Retention.of_seconds(settings.dedupe.ttl_s),
                                clock_ms=lambda: int(time.time() * 1000))
        in_p0 = SimpleNamespace(partition=0)
        old = ["old-%d" % i for i in range(200)]
        for key in old:
            faust_edge.in_partition_of(in_p0, lambda key=key: results.put(key, b"result"))
        readable_at_once = sum(1 for key in old if results.get(key) is not None)
        time.sleep(3.0)  # past the 1 s TTL, in RocksDB's whole seconds too
        db = table.data._db_for_partition(0)
        on_disk_before = sum(1 for key in db.keys() if key.startswith(b"old-"))
        readable_before = sum(1 for key in old if results.get(key) is not None)
        faust_edge.in_partition_of(in_p0, lambda: results.put("new", b"fresh"))
        db.compact_range(None, None)
        print(json.dumps({{
            "readable_at_once": readable_at_once,
            "on_disk_before": on_disk_before,
            "readable_before": readable_before,
            "on_disk_after": sum(1 for key in db.keys() if key.startswith(b"old-")),
            "new_after": (results.get("new") or b"").decode(),
        }}))
    """
    out = _run(code)
    assert out["readable_at_once"] == 200
    # Past the TTL: the read refuses them, yet they are still stored ...
    assert out["readable_before"] == 0
    assert out["on_disk_before"] == 200
    # ... until a compaction, which drops them and keeps what is still fresh.
    assert out["on_disk_after"] == 0
    assert out["new_after"] == "fresh"


@pytest.mark.parametrize("memory_mib", [None, "8"], ids=["default", "8-mib"])
def test_the_stores_memory_stays_within_its_bound_however_many_results_are_stored(
    tmp_path: Path, memory_mib: str | None
) -> None:
    """40 MB of distinct results into one partition of the worker's app's store: its
    memtables never hold more than PIPELINE_DEDUPE_STORE_MEMORY_MIB allows (the rest is
    flushed to disk), and its block cache has the setting's capacity (Faust's default is
    2 GiB), at the default and at a bound set through the setting."""
    env = {
        "PIPELINE_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
        "PIPELINE_WORKER_APP_ID": "memory-test",
        "PIPELINE_WORKER_DATA_DIR": str(tmp_path),
        **({"PIPELINE_DEDUPE_STORE_MEMORY_MIB": memory_mib} if memory_mib else {}),
    }
    code = f"""
        import json, os, time
        from types import SimpleNamespace
        from pipeline.app import create_app
        from pipeline.kafka import faust_edge
        from pipeline.settings import Settings
        from pipeline.worker.dedupe import TABLE_NAME, Retention, StoredResults

        settings = Settings.from_env({env!r})
        app = create_app(settings)
        table = app.tables[TABLE_NAME]
        store = faust_edge.ChangelogStore(table, lambda *args: None)
        results = StoredResults(store, retention=Retention.of_seconds(settings.dedupe.ttl_s),
                                clock_ms=lambda: int(time.time() * 1000))
        in_p0 = SimpleNamespace(partition=0)
        payload = os.urandom(2000)
        db = table.data._db_for_partition(0)
        most = 0
        for i in range(20_000):
            faust_edge.in_partition_of(in_p0, lambda: results.put("k%d" % i, payload))
            if i % 500 == 0:
                most = max(most, db.property_int_value("rocksdb.cur-size-all-mem-tables"))
        print(json.dumps({{
            "most_in_memtables": most,
            "cache": db.property_int_value("rocksdb.block-cache-capacity"),
            "readable": sum(1 for i in range(0, 20_000, 999) if results.get("k%d" % i)),
        }}))
    """
    out = _run(code)
    mib = Settings.from_env(env).dedupe.store_memory_mib
    assert mib == (int(memory_mib) if memory_mib else 32)
    bound = store_memory(mib)
    memtables = bound["write_buffer_size"] * bound["max_write_buffer_number"]
    assert memtables + bound["block_cache_size"] == mib * 2**20
    assert 0 < out["most_in_memtables"] <= memtables * 1.1  # an arena block of slack
    assert out["cache"] == bound["block_cache_size"]
    assert out["readable"] == len(range(0, 20_000, 999))


def test_a_store_memory_below_its_least_is_refused_with_the_setting_named() -> None:
    with pytest.raises(ConfigurationError, match="PIPELINE_DEDUPE_STORE_MEMORY_MIB=2: expected"):
        Settings.from_env({"PIPELINE_DEDUPE_STORE_MEMORY_MIB": "2"})
    with pytest.raises(ConfigurationError, match="expected a number"):
        Settings.from_env({"PIPELINE_DEDUPE_STORE_MEMORY_MIB": "32MiB"})
    assert DedupeSettings().store_memory_mib == 32


def test_the_stores_files_and_memtables_keep_bloom_filters(tmp_path: Path) -> None:
    """Every new text probes the store: its files are written with Bloom filters of
    BLOOM_BITS_PER_KEY bits a key, not Faust's 3 (measured as RocksDB reports its
    flushed files: filter bytes x 8 / keys filtered), and its memtables have one too."""
    code = f"""
        import json
        from types import SimpleNamespace
        from pipeline.app import create_app
        from pipeline.kafka import faust_edge
        from pipeline.settings import Settings
        from pipeline.worker.dedupe import TABLE_NAME, Retention, StoredResults

        settings = Settings.from_env({{
            "PIPELINE_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
            "PIPELINE_WORKER_APP_ID": "bloom-test",
            "PIPELINE_WORKER_DATA_DIR": {str(tmp_path)!r},
        }})
        app = create_app(settings)
        table = app.tables[TABLE_NAME]
        # As in a worker: the partition's store opens (at its assignment) before the
        # worker's services make the ChangelogStore.
        db = table.data._db_for_partition(0)
        results = StoredResults(faust_edge.ChangelogStore(table, lambda *args: None),
                                retention=Retention.of_seconds(60), clock_ms=lambda: 0)
        in_p0 = SimpleNamespace(partition=0)
        for i in range(20_000):
            faust_edge.in_partition_of(in_p0, lambda: results.put("k%d" % i, b"result"))
        db.flush()
        faust_edge.in_partition_of(in_p0, lambda: results.put("after", b"result"))
        props = dict(part.strip().split("=", 1) for part in
                     db.property_value("rocksdb.aggregated-table-properties").split(";")
                     if "=" in part)
        print(json.dumps({{"filter_bytes": int(props["filter block size"]),
                          "filtered": int(props["# entries for filter"]),
                          "stored": results.get("k7") is not None,
                          # A memtable of one key since the flush: about its filter's size.
                          "empty_memtable": db.property_int_value(
                              "rocksdb.cur-size-active-mem-table")}}))
    """
    out = _run(code)
    assert out["stored"] is True and out["filtered"] == 20_000
    bits_per_key = out["filter_bytes"] * 8 / out["filtered"]
    assert bits_per_key == pytest.approx(BLOOM_BITS_PER_KEY, rel=0.1)
    # ... and each memtable a filter of MEMTABLE_FILTER_RATIO of its size (an empty
    # memtable without one takes a few KiB).
    memtable = store_memory(DedupeSettings().store_memory_mib)["write_buffer_size"]
    assert out["empty_memtable"] >= 0.9 * MEMTABLE_FILTER_RATIO * memtable
