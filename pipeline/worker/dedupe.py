"""Dedupe state: stored results, and single-flight of computations.

Three levels, cheapest first:

1. ``batch``: the same key twice in one batch is computed once;
2. ``inflight``: a key whose computation is already running gets its answer
   from that computation (:class:`SingleFlight`);
3. ``stored``: a key answered before, within the TTL, is served from the
   RocksDB table (:class:`StoredResults`).

The keys themselves are :mod:`pipeline.codecs.keys`. A stored entry is written
only after its result was acknowledged by the broker.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = [
    "BLOOM_BITS_PER_KEY",
    "TABLE_NAME",
    "Retention",
    "SingleFlight",
    "StoredEntry",
    "StoredResults",
    "changelog_topic",
    "store_memory",
]

log = logging.getLogger(__name__)

_STORED = struct.Struct(">q")


#: The Faust table of stored results; its changelog topic is ``{app_id}-dedupe-changelog``.
TABLE_NAME = "dedupe"

_MIB = 1024 * 1024

#: Bits per key of each stored-results file's Bloom filter (Faust's default: 3). Every
#: new text probes the store of each partition held, and a probe past a filter's false
#: positive reads a block from disk: at 3 bits (~1 in 5 per file) a miss over three
#: partitions' stores cost 9.2 µs; at 10 (~1 in 100), 2.7 (120,000 results of 1.7 KB,
#: the default memory bound). The filters take 10 bits a stored result.
BLOOM_BITS_PER_KEY = 10


def store_memory(mib: int) -> dict[str, int]:
    """RocksDB's options for a partition store that holds at most ``mib`` MiB in memory
    (``PIPELINE_DEDUPE_STORE_MEMORY_MIB``): two memtables of a quarter each and a block
    cache of half. Faust's defaults (three 64 MiB memtables, a 2 GiB cache, each per
    partition) let a worker's RSS grow by every result stored, about 300 MiB an hour at
    50 req/s of new texts, for gigabytes before a plateau (docs/soak)."""
    return {
        "write_buffer_size": mib * _MIB // 4,
        "max_write_buffer_number": 2,
        "block_cache_size": mib * _MIB // 2,
    }


def changelog_topic(app_id: str) -> str:
    """The name Faust gives the stored results' changelog topic for app ``app_id``."""
    return f"{app_id}-{TABLE_NAME}-changelog"


@dataclass(frozen=True)
class Retention:
    """The dedupe TTL, and everything it decides, in one place.

    A stored result older than ``ttl_ms`` is never served (:meth:`fresh`, asked by
    :class:`StoredResults` on every read) and leaves the store's two copies:
    RocksDB drops it at compaction (:meth:`table_options`, the table's ``ttl``),
    and the broker drops it from the changelog (:meth:`changelog_config`).
    """

    ttl_ms: int

    @classmethod
    def of_seconds(cls, ttl_s: int) -> Retention:
        return cls(max(1, ttl_s) * 1000)

    def fresh(self, stored_at_ms: int, now_ms: int) -> bool:
        """Whether an entry stored at ``stored_at_ms`` may still be served at ``now_ms``."""
        return now_ms - stored_at_ms <= self.ttl_ms

    def table_options(self, memory_mib: int) -> dict[str, int]:
        """The Faust table's RocksDB options: entries past the TTL go at compaction,
        each partition's store holds at most ``memory_mib`` MiB in memory
        (:func:`store_memory`), and its files' Bloom filters keep :data:`BLOOM_BITS_PER_KEY`
        bits a key."""
        return {
            "ttl": max(1, self.ttl_ms // 1000),
            "bloom_filter_size": BLOOM_BITS_PER_KEY,
            **store_memory(memory_mib),
        }

    def changelog_config(self) -> dict[str, str]:
        """Topic config of the dedupe table's changelog: compacted, and pruned once older
        than the TTL (an entry that old is never served, so nothing served is lost).

        Segments roll at the TTL (between a minute and a day), so a closed segment, the
        only kind the broker deletes, exists within about TTL + one segment.
        """
        ttl_ms = max(1000, self.ttl_ms)
        return {
            "cleanup.policy": "compact,delete",
            "retention.ms": str(ttl_ms),
            "segment.ms": str(min(max(ttl_ms, 60_000), 86_400_000)),
        }


@dataclass(frozen=True)
class StoredEntry:
    """An encoded result and when it was stored (epoch ms)."""

    stored_at_ms: int
    result: bytes

    def encode(self) -> bytes:
        return _STORED.pack(self.stored_at_ms) + self.result

    @classmethod
    def decode(cls, raw: bytes) -> StoredEntry | None:
        if len(raw) <= _STORED.size:
            return None
        (stored_at,) = _STORED.unpack_from(raw)
        return cls(stored_at_ms=stored_at, result=bytes(raw[_STORED.size :]))


class StoredResults:
    """Stored results keyed by content hash, over any mutable mapping of bytes.

    In the worker the mapping is a Faust table on the ``rocksdb://`` store;
    ``get`` ignores entries past the ``retention``'s TTL (RocksDB's own TTL only
    removes them at compaction); entries of another model version are the
    answer path's to refuse.
    """

    def __init__(
        self,
        table: MutableMapping[bytes, bytes],
        *,
        retention: Retention,
        clock_ms: Callable[[], int],
    ) -> None:
        self._table = table
        self._retention = retention
        self._clock_ms = clock_ms

    def get(self, key: str) -> bytes | None:
        """The stored encoded result for ``key``, or None when absent or expired."""
        try:
            raw = self._table.get(key.encode("ascii"))
        except Exception as exc:  # a store that cannot read is a miss, not a crash
            log.warning(
                "stored-result lookup failed (%s: %s); computing instead", type(exc).__name__, exc
            )
            return None
        if raw is None:
            return None
        entry = StoredEntry.decode(raw)
        if entry is None or not self._retention.fresh(entry.stored_at_ms, self._clock_ms()):
            return None
        return entry.result

    def put(self, key: str, result: bytes) -> None:
        """Store ``result`` under ``key``; call only after the broker acknowledged it."""
        entry = StoredEntry(stored_at_ms=self._clock_ms(), result=result)
        self._table[key.encode("ascii")] = entry.encode()


W = TypeVar("W")


class SingleFlight(Generic[W]):
    """At most one computation per key at a time; later requesters join it.

    ``join(key, waiter)`` returns True for the first waiter of a key (the
    leader, who must get the key computed) and False for those who join a
    computation already under way. ``finish(key)`` removes the key and
    returns every waiter, leader first, so each can be answered; a waiter
    that joins after ``finish`` starts a new computation.
    """

    def __init__(self) -> None:
        self._waiters: dict[str, list[W]] = {}

    def __len__(self) -> int:
        return len(self._waiters)

    def __contains__(self, key: object) -> bool:
        return key in self._waiters

    def join(self, key: str, waiter: W) -> bool:
        waiters = self._waiters.get(key)
        if waiters is None:
            self._waiters[key] = [waiter]
            return True
        waiters.append(waiter)
        return False

    def finish(self, key: str) -> list[W]:
        return self._waiters.pop(key)
