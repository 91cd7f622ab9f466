"""Fetched lane records waiting for intake: per partition in offset order, bounded per lane.

The consumer hands each fetch's lane records over at once
(:func:`pipeline.kafka.faust_edge.install`); the reader (:mod:`pipeline.worker.lane_reader`)
takes them from here, realtime first. A lane holding more than its bound, in
records or in bytes, has the partitions it holds records of taken out of the
fetcher (``pause``) until it is down to half of the bound (``resume``).
Records already fetched are still accepted, so a lane exceeds its bound by at
most one fetch.

Pure: no Faust, no Kafka. A record is anything with ``topic``, ``partition``,
``offset``, ``key``, ``value`` and ``tp``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from pipeline.worker.admission import LaneBounds
from pipeline.worker.records import record_size

__all__ = ["SKIP", "STOP", "TAKEN", "LaneBuffer"]

#: What a taker says of the record it was shown (:meth:`LaneBuffer.drain`).
TAKEN, SKIP, STOP = 0, 1, 2


class LaneBuffer:
    """Records fetched and not yet taken (see the module's promise)."""

    def __init__(
        self,
        lane_of_topic: Mapping[str, str],
        bounds: LaneBounds,
        *,
        pause: Callable[[Any], None],
        resume: Callable[[Any], None],
    ) -> None:
        self._lane_of = dict(lane_of_topic)
        self.bounds = bounds
        self._pause, self._resume = pause, resume
        lanes = sorted(set(self._lane_of.values()))
        self._parts: dict[str, dict[Hashable, deque[Any]]] = {lane: {} for lane in lanes}
        self._records = dict.fromkeys(lanes, 0)
        self._bytes = dict.fromkeys(lanes, 0)
        self._paused: dict[str, set[Hashable]] = {lane: set() for lane in lanes}
        #: Set whenever records arrive; the reader clears it before it looks.
        self.arrived = asyncio.Event()

    def put(self, records: Iterable[Any]) -> None:
        """Buffer one fetch's lane records (in the consumer's order); pause full lanes."""
        touched: set[str] = set()
        for record in records:
            lane = self._lane_of[record.topic]
            parts = self._parts[lane]
            queue = parts.get(record.tp)
            if queue is None:
                queue = parts[record.tp] = deque()
            queue.append(record)
            self._records[lane] += 1
            self._bytes[lane] += record_size(record)
            touched.add(lane)
        for lane in touched:
            if self._over(lane, 1):
                for tp in self._parts[lane]:
                    if tp not in self._paused[lane]:
                        self._paused[lane].add(tp)
                        self._pause(tp)
        if touched:
            self.arrived.set()

    def _over(self, lane: str, fraction: float) -> bool:
        return (
            self._records[lane] > self.bounds.max_records * fraction
            or self._bytes[lane] > self.bounds.max_bytes * fraction
        )

    def drain(self, lane: str, take: Callable[[Any], int], limit: int) -> int:
        """Show ``lane``'s records to ``take``, each partition's in offset order, until
        ``limit`` were taken or none is left; returns how many were taken. Partitions
        take turns: one served and not emptied goes last for the next call.

        ``take`` returns TAKEN (the record leaves the buffer), SKIP (it stays, and so
        do the rest of its partition's) or STOP (it stays, and the lane is done).
        """
        taken = 0
        parts = self._parts[lane]
        for tp in list(parts):
            queue = parts[tp]
            verdict = TAKEN
            before = taken
            while queue and taken < limit:
                verdict = take(queue[0])
                if verdict != TAKEN:
                    break
                record = queue.popleft()
                self._records[lane] -= 1
                self._bytes[lane] -= record_size(record)
                taken += 1
            if not queue:
                del parts[tp]
            elif taken > before:  # served: the lane's other partitions go first next time
                parts[tp] = parts.pop(tp)
            if verdict == STOP or taken >= limit:
                break
        if taken and self._paused[lane] and not self._over(lane, 0.5):
            for tp in self._paused[lane]:
                self._resume(tp)
            self._paused[lane].clear()
        return taken

    def drop(self, tps: Iterable[Hashable]) -> list[Any]:
        """Take the records of ``tps`` out (revoked); return them."""
        dropped: list[Any] = []
        for tp in tps:
            for lane, parts in self._parts.items():
                queue = parts.pop(tp, None)
                if queue:
                    dropped.extend(queue)
                    self._records[lane] -= len(queue)
                    self._bytes[lane] -= sum(record_size(r) for r in queue)
                if tp in self._paused[lane]:
                    self._paused[lane].discard(tp)
                    self._resume(tp)
        return dropped

    def clear(self) -> list[Any]:
        """Take every record out (a rebalance gives up what was not started)."""
        tps = {tp for parts in self._parts.values() for tp in parts}
        tps.update(tp for paused in self._paused.values() for tp in paused)
        return self.drop(tps)

    def holds(self, tp: Hashable) -> bool:
        """Whether records of partition ``tp`` wait here."""
        return any(parts.get(tp) for parts in self._parts.values())

    def pending(self, lane: str | None = None) -> int:
        """Records buffered (in one lane, or in all; none in a lane whose topic this
        worker does not consume, PIPELINE_WORKER_LANES)."""
        if lane is not None:
            return self._records.get(lane, 0)
        return sum(self._records.values())
