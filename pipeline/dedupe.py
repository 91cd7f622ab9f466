"""Dedupe: content hashes, stored results, and single-flight of computations.

Three levels, cheapest first:

1. ``batch``: the same hash twice in one batch is computed once;
2. ``inflight``: a hash whose computation is already running gets its answer
   from that computation (:class:`SingleFlight`);
3. ``stored``: a hash answered before, within the TTL and for the same model
   version, is served from the RocksDB table (:class:`StoredResults`).

A stored entry is written only after its result was acknowledged by the broker.
"""

from __future__ import annotations

import hashlib
import logging
import re
import struct
import unicodedata
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["SingleFlight", "StoredEntry", "StoredResults", "content_hash", "normalise"]

log = logging.getLogger(__name__)

_SPACE = re.compile(r"\s+")
_STORED = struct.Struct(">q")


def normalise(text: str) -> str:
    """NFC-normalise, trim, and collapse runs of whitespace to one space."""
    return _SPACE.sub(" ", unicodedata.normalize("NFC", text)).strip()


def content_hash(text: str, model_id: str) -> str:
    """Hex hash of the normalised text and the model id: the request's Kafka key.

    Equal for texts that differ only in whitespace or Unicode composition, so
    they meet on one partition and are computed once.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(model_id.encode("utf-8"))
    h.update(b"\x00")
    h.update(normalise(text).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


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
    ``get`` ignores entries older than ``ttl_ms`` (RocksDB's own TTL only
    removes them at compaction) and entries of another model version, which
    the caller checks via ``accept``.
    """

    def __init__(
        self,
        table: MutableMapping[bytes, bytes],
        *,
        ttl_ms: int,
        clock_ms: Callable[[], int],
    ) -> None:
        self._table = table
        self._ttl_ms = ttl_ms
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
        if entry is None or self._clock_ms() - entry.stored_at_ms > self._ttl_ms:
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
