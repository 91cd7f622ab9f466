"""Offsets of lane partitions that aiokafka's fetcher read past without handing over a
record: the broker's log says they hold none for this consumer.

A fetch response is a contiguous stretch of the partition's log. aiokafka walks it
from the consumer's position (``FetchResult.getall``: it hands over nothing unless
its data starts exactly there) and moves the position past everything it walked:
records it hands over, and batches it skips by itself: a transaction's control
marker, an aborted transaction's records under ``read_committed``, and offsets a
compaction removed. So every offset between the position before a ``getall`` and
the position after it that is not the offset of a record handed over is explained
by the log itself: no record was ever there to lose.

That is what the lane reader needs to tell a transaction marker from records the
consumer skipped (``pipeline/worker/continuity.py``): Faust drops records only after
aiokafka handed them over (the rest of a fetch, around rebalances), and such offsets
are never noted here; a jump the log does not explain is still sought back for.

The notes are kept per partition as merged ranges, pruned below the offset the
reader asks about, and bounded (:data:`MAX_RANGES` per partition, the oldest
dropped first): a note lost only costs the reader a seek back, never a record.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["MAX_RANGES", "PassedOffsets"]

#: Ranges kept per partition; past it the lowest are dropped (the reader seeks instead).
MAX_RANGES = 1024

Partition = tuple[str, int]


class PassedOffsets:
    """Ranges of offsets the fetcher passed without a record, per lane partition of
    ``topics``. :meth:`note` runs on the consumer's thread, the queries on the event
    loop's: every method takes one lock."""

    def __init__(self, topics: Iterable[str], max_ranges: int = MAX_RANGES) -> None:
        self._topics = frozenset(topics)
        self._max = max_ranges
        # partition -> ascending, disjoint, non-adjacent [low, high] (inclusive) pairs
        self._lows: dict[Partition, list[int]] = {}
        self._highs: dict[Partition, list[int]] = {}
        self._lock = threading.Lock()

    def note(self, tp: Any, start: int, records: Sequence[Any], end: int) -> None:
        """A ``getall`` of ``tp`` moved the position from ``start`` to ``end`` and handed
        over ``records`` (ascending offsets, all in that range): note the offsets between
        them that hold no record."""
        if end - start <= len(records) or tp[0] not in self._topics:
            return  # nothing passed without a record (the common case: one comparison)
        partition = (tp[0], tp[1])
        gaps: list[tuple[int, int]] = []
        at = start
        for record in records:
            if record.offset > at:
                gaps.append((at, record.offset - 1))
            at = record.offset + 1
        if end > at:
            gaps.append((at, end - 1))
        with self._lock:
            for low, high in gaps:
                self._add(partition, low, high)

    def _add(self, partition: Partition, low: int, high: int) -> None:
        lows = self._lows.setdefault(partition, [])
        highs = self._highs.setdefault(partition, [])
        # Ranges that touch [low, high] (overlap or adjacent) merge into one.
        first = bisect.bisect_left(highs, low - 1)
        last = bisect.bisect_right(lows, high + 1)
        if first < last:
            low = min(low, lows[first])
            high = max(high, highs[last - 1])
        lows[first:last] = [low]
        highs[first:last] = [high]
        if len(lows) > self._max:
            del lows[0], highs[0]

    def explains(self, tp: Any, low: int, high: int) -> bool:
        """Whether every offset ``low..high`` of ``tp`` was passed without a record.
        Ranges wholly below ``low`` are dropped: the reader has moved past them."""
        partition = (tp[0], tp[1])
        with self._lock:
            lows, highs = self._lows.get(partition), self._highs.get(partition)
            if not lows or highs is None:
                return False
            below = bisect.bisect_left(highs, low)
            if below:
                del lows[:below], highs[:below]
            return bool(lows) and lows[0] <= low and high <= highs[0]

    def forget(self, tp: Any) -> None:
        """``tp`` was revoked: its next assignment notes afresh."""
        partition = (tp[0], tp[1])
        with self._lock:
            self._lows.pop(partition, None)
            self._highs.pop(partition, None)

    def ranges(self, tp: Any) -> list[tuple[int, int]]:
        """The ranges noted for ``tp`` (for tests and the bound)."""
        partition = (tp[0], tp[1])
        with self._lock:
            return list(
                zip(self._lows.get(partition, []), self._highs.get(partition, []), strict=True)
            )
