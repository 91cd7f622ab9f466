"""The dedupe table's store: Faust's local RocksDB, its changelog written by the worker.

See :class:`ChangelogStore`; :func:`pipeline.kafka.faust_edge.check` names the private
attributes of Faust's RocksDB store it relies on.
"""

from __future__ import annotations

import contextvars
import logging
import shutil
import time
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

from faust.types import TP
from mode.utils.collections import LRUCache
from rocksdict import WriteOptions

__all__ = [
    "KEY_INDEX_LIMIT",
    "MEMTABLE_FILTER_RATIO",
    "ChangelogSend",
    "ChangelogStore",
    "filter_memtables",
    "in_partition_of",
]

log = logging.getLogger(__name__)

#: Most keys Faust's RocksDB store may remember the partition of (its ``_key_index``).
KEY_INDEX_LIMIT = 1000

#: Longest a dedupe put waits out a RocksDB write stall before it fails (seconds). A
#: healthy disk flushes a memtable in milliseconds; a full one never does, and RocksDB,
#: recovering from the full disk, would hold a stalled put (and the event loop) until
#: space came back.
STALL_LIMIT_S = 10.0

#: Share of each memtable's size given to a Bloom filter of its keys (whole keys). Every
#: new text probes the memtables of each partition's store held before it reaches the
#: files' filters (dedupe.BLOOM_BITS_PER_KEY); without one, each probe is a skip-list
#: seek: a miss over three stores of 40,000 results of 1.7 KB took 2.1-2.5 us against
#: 1.0 with it. It is part of its memtable's size (0.8 MiB of the default 8 MiB).
MEMTABLE_FILTER_RATIO = 0.1

#: The partition a :class:`ChangelogStore` write is for (:func:`in_partition_of`).
_PARTITION: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "dedupe_partition", default=None
)


def in_partition_of(token: Any, fn: Callable[[], None]) -> None:
    """Run a dedupe write for the input whose token (Faust message) is ``token``: the
    entry goes to the input's partition of the store, and its changelog record to
    that partition of the changelog."""
    reset = _PARTITION.set(int(token.partition))
    try:
        fn()
    finally:
        _PARTITION.reset(reset)


def filter_memtables(table: Any, ratio: float = MEMTABLE_FILTER_RATIO) -> None:
    """Give each memtable of ``table``'s RocksDB stores a whole-key Bloom filter of
    ``ratio`` of its size (0: none), through that table's own options (Faust's have no
    setting for it). Call it as the table is made: a partition's store opened before
    keeps Faust's options (the worker's stores open as partitions are assigned, which
    can be before the worker's own services start)."""
    if ratio <= 0:
        return
    options = table.data.rocksdb_options
    faust_options = options.as_options

    def as_options() -> Any:
        made = faust_options()
        made.set_memtable_prefix_bloom_ratio(ratio)  # no prefix extractor: whole keys only
        made.set_memtable_whole_key_filtering(True)
        return made

    options.as_options = as_options  # this table's, where Faust's open() reads them


#: Sends one changelog record without waiting: (topic, key, value, partition,
#: on_delivery(err, msg) called on the producer's polling thread); raises BufferError
#: while the producer's queue is full.
ChangelogSend = Callable[[str, bytes, bytes, int, Callable[[Any, Any], None]], None]


class ChangelogStore(MutableMapping[bytes, bytes]):
    """A Faust table's local RocksDB store, with its changelog written by ``send``.

    Reads and writes go to ``table.data`` (the store Faust restores from the
    changelog on assignment); a write, made for a record (see
    :func:`in_partition_of`), also sends ``(key, value)`` to the table's
    changelog topic, on the record's partition, exactly as Faust would (raw
    key and value bytes), so Faust's recovery reads it back. The send is not
    awaited: a changelog record lost in a crash only costs a recomputation on
    the partition's next owner. Delivered offsets are remembered per partition
    and written as the store's persisted offsets by :meth:`flush_offsets`, so a
    restart replays only the changelog's tail.

    Memory stays flat however many distinct keys are written: entries live in
    RocksDB (on disk, TTL'd), nothing here keeps a key, and the one per-key map of
    Faust's store, ``_key_index`` (key -> partition, filled by Faust's own table
    reads and writes, which this class does not use), is made a bounded LRU of
    :data:`KEY_INDEX_LIMIT` keys whatever the Faust/mode release made it.
    ``_delivered`` holds one offset per changelog partition.

    Without ``wal`` (the default, ``PIPELINE_DEDUPE_STORE_WAL``) every write to a
    partition's store, Faust's own included, skips RocksDB's write-ahead log: the log
    cost a worker one ``write`` call and about 4 µs per 1.7 KB result (13 µs of its
    interpreter lock per result under load, a tenth of it, docs/design.md). The
    changelog topic is the durable copy. A clean stop loses nothing (RocksDB flushes
    unlogged memtables on close); a crash loses the memtables' writes, the persisted
    offsets among them, so what survives is a prefix of the writes and Faust's
    recovery replays the changelog from the offset that survived: at most two
    memtables of it (``PIPELINE_DEDUPE_STORE_MEMORY_MIB`` / 2) more than with the log.
    A full disk fails a put only once a memtable must be flushed, not at once.

    The stores have a Bloom filter in each memtable when the table was given one as it
    was made (:func:`filter_memtables`; ``pipeline.app`` does).

    A put never blocks in RocksDB: it is made with ``no_slowdown`` and, while RocksDB
    stalls writes (its memtables full, waiting on a flush), retried with short sleeps
    for at most ``stall_limit_s``, then fails with the disk's free space in the message.
    Left to RocksDB, a put that met the stall as the disk filled waited for the disk to
    be freed, holding the worker's event loop all that time.

    Once Faust has stopped the store (its databases dropped, at the worker's stop,
    before the runtime's last answers), writes go to the changelog only: Faust would
    open a partition's database again for them and never close it.
    """

    def __init__(
        self,
        table: Any,
        send: ChangelogSend,
        *,
        wal: bool = False,
        stall_limit_s: float = STALL_LIMIT_S,
    ) -> None:
        self._data: Any = table.data
        self._data._key_index = LRUCache(limit=KEY_INDEX_LIMIT)
        self._topic: str = table.changelog_topic.get_topic_name()
        self._send = send
        self._delivered: dict[int, int] = {}
        self._wal = wal
        # id() of each partition's database whose writes skip the log: a reference
        # would keep a revoked partition's database (and its directory lock) open.
        self._unlogged: dict[int, int] = {}
        self._stall_limit_s = stall_limit_s
        self._put_options = WriteOptions()
        # Properties (rocksdict 0.3's stub calls disable_wal a method).
        self._put_options.disable_wal = not wal  # type: ignore[method-assign,assignment]
        self._put_options.no_slowdown = True
        self.failures = 0
        self.stopped = False
        faust_stop = self._data.stop

        async def stop() -> None:
            self.stopped = True
            await faust_stop()

        self._data.stop = stop

    def __getitem__(self, key: bytes) -> bytes:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value  # type: ignore[no-any-return]

    def get(self, key: bytes, default: Any = None) -> Any:
        """Looks in every partition's store held here (a text may be stored under
        another partition's input: the key partitions by the exact text). Straight
        to RocksDB: Faust's table read (serializer lookup, key index, a bloom-filter
        probe then a read per partition) cost a noop worker about 15 % of its time."""
        for db in self._data._dbs.values():
            value = db.get(key)
            if value is not None:
                return value
        return default

    def __setitem__(self, key: bytes, value: bytes) -> None:
        partition = _PARTITION.get()
        if partition is None:
            raise RuntimeError("a dedupe entry is written for a record (in_partition_of)")
        if not self.stopped:  # else the changelog's copy is all: see the class's docs
            self._put(self._db(partition), key, value)
        try:
            self._send(self._topic, key, value, partition, self._done)
        except BufferError:
            self._failed(partition, "the producer's queue is full")
        except Exception as exc:  # refused outright: the entry stays local
            self._failed(partition, repr(exc))

    def _put(self, db: Any, key: bytes, value: bytes) -> None:
        """``db.put``, waiting out a write stall for at most ``stall_limit_s``."""
        if not hasattr(db, "set_write_options"):  # not rocksdict: its own put
            db.put(key, value)
            return
        deadline, pause = 0.0, 0.001
        while True:
            try:
                db.put(key, value, self._put_options)
                return
            except Exception as exc:  # rocksdict raises a bare Exception
                if "Write stall" not in str(exc):
                    raise
            now = time.monotonic()
            if not deadline:
                deadline = now + self._stall_limit_s
            elif now >= deadline:
                raise OSError(
                    f"RocksDB stalled the dedupe store's writes for {self._stall_limit_s:g} s "
                    f"(a memtable it cannot flush: is the disk full? "
                    f"{_free_bytes(db.path())} bytes free under {db.path()})"
                )
            time.sleep(pause)  # a stall is a flush's length on a healthy disk: ms
            pause = min(pause * 2, 0.05)

    def _db(self, partition: int) -> Any:
        """The partition's database, its writes set to skip the log unless ``wal``."""
        db = self._data._db_for_partition(partition)
        if not self._wal and self._unlogged.get(partition) != id(db):
            options = WriteOptions()
            # A property (rocksdict 0.3's stub calls it a method).
            options.disable_wal = True  # type: ignore[method-assign,assignment]
            set_options = getattr(db, "set_write_options", None)  # rocksdict's; not every driver's
            if set_options is not None:
                set_options(options)
            self._unlogged[partition] = id(db)
        return db

    def _done(self, err: Any, msg: Any) -> None:
        # On the producer's polling thread, without a future per record: a lost race
        # with flush_offsets only leaves a persisted offset behind (more is replayed).
        if err is not None:
            self._failed(msg.partition(), str(err))
            return
        partition, offset = msg.partition(), msg.offset()
        if offset > self._delivered.get(partition, -1):
            self._delivered[partition] = offset

    def _failed(self, partition: int, why: str) -> None:
        self.failures += 1
        if self.failures == 1 or not self.failures % 1000:
            log.warning(
                "dedupe changelog %s[%d]: a record was not written (%s; %d so far): "
                "the entry is only local, another worker will compute it again",
                self._topic,
                partition,
                why,
                self.failures,
            )

    def flush_offsets(self) -> None:
        """Record the changelog offsets delivered so far as the store's persisted ones."""
        if self.stopped:
            return
        delivered, self._delivered = self._delivered, {}
        for partition, offset in delivered.items():
            self._db(partition)  # unlogged like the entries: a crash keeps a prefix
            self._data.set_persisted_offset(TP(self._topic, partition), offset)

    def __delitem__(self, key: bytes) -> None:
        raise NotImplementedError("dedupe entries leave by TTL, never by delete")

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def _free_bytes(path: str) -> int | str:
    """Free bytes on the file system of ``path``; ``"?"`` where it cannot be read."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return "?"
