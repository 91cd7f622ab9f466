"""Lane gates: which lanes take records now, and work waiting for room in a lane queue.

A lane is closed while it is paused (its scheduler queue reached its bound,
or load shedding pauses it) or while work its full queue refused is parked;
realtime is paused last and resumed first. Parked work is queued again,
oldest first, as soon as its lane's queue has room. Whenever a lane may take
records again, ``on_room`` tells whoever feeds the runtime (the lane reader).

No Faust, no Kafka: the scheduler and the shedding policy are injected.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from pipeline.observability.logs import Tally
from pipeline.observability.metrics import PipelineMetrics
from pipeline.scheduling import Queued, Scheduler
from pipeline.settings import LANES

__all__ = ["LaneGates"]

log = logging.getLogger(__name__)

#: At most one log line per this many seconds for each lane's pauses at its queue's
#: bound, and one for its resumes: under a backlog they alternate every few ms (the
#: bound is the backpressure working), and ``pipeline_lane_paused`` has every one.
#: A pause by load shedding, and the resume that ends it, are each logged.
FLOW_LOG_S = 10.0

T = TypeVar("T", bound=Queued)


class LaneGates(Generic[T]):
    """Pauses and parked work per lane (see the module's promise); ``clock`` (seconds)
    paces the log lines of pauses at a queue's bound (:data:`FLOW_LOG_S`)."""

    def __init__(
        self,
        scheduler: Scheduler[T],
        metrics: PipelineMetrics,
        *,
        shed_lanes: Callable[[], frozenset[str] | set[str]],
        on_room: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scheduler = scheduler
        self.metrics = metrics
        self._shed_lanes = shed_lanes
        self._on_room = on_room or (lambda: None)
        self._queue_paused: set[str] = set()  # lanes the scheduler's queues want paused
        self.paused: set[str] = set()  # lanes paused now, for any reason: take none
        self._shed_paused: set[str] = set()  # of those, the ones load shedding paused
        # Work its lane's full queue refused, oldest first; the lane takes no record meanwhile.
        self._parked: dict[str, deque[T]] = {lane: deque() for lane in LANES}
        self._flow_log = {
            (event, lane): Tally(FLOW_LOG_S, clock)
            for event in ("paused", "resumed")
            for lane in LANES
        }

    def open(self, lane: str) -> bool:
        """Whether ``lane`` takes records now (not paused, nothing parked)."""
        return lane not in self.paused and not self._parked[lane]

    def offer(self, item: T) -> None:
        """Queue ``item`` in the scheduler; park it (and pause its lane) while the lane's
        queue is full or earlier work of the lane is parked."""
        parked = self._parked[item.lane]
        if parked or not self.scheduler.offer(item):
            parked.append(item)
            self.apply()

    def apply(self) -> None:
        """Queue parked work where there is room; pause the lanes that full queues or
        load shedding want paused; resume the rest."""
        self._unpark()
        for lane in self.scheduler.lanes_to_pause():
            self._queue_paused.add(lane)
        for lane in self.scheduler.lanes_to_resume():
            self._queue_paused.discard(lane)
        want = self._queue_paused | self._shed_lanes()
        for lane in reversed(LANES):  # realtime is paused last and resumed first
            if lane in want and lane not in self.paused:
                self.paused.add(lane)
                self.metrics.paused(lane, True)
                depth = self.scheduler.depth(lane)
                if lane not in self._queue_paused:
                    self._shed_paused.add(lane)
                    log.info("lane %s paused: load shedding (%d queued)", lane, depth)
                elif (times := self._flow_times("paused", lane)) is not None:
                    log.info("lane %s paused: queue at its bound (%d queued)%s", lane, depth, times)
        resumed = False
        for lane in LANES:
            if lane not in want and lane in self.paused:
                self.paused.discard(lane)
                self.metrics.paused(lane, False)
                if lane in self._shed_paused:  # as its pause line, never folded into a count
                    self._shed_paused.discard(lane)
                    log.info("lane %s resumed: load shedding over", lane)
                elif (times := self._flow_times("resumed", lane)) is not None:
                    log.info("lane %s resumed%s", lane, times)
                resumed = True
        if resumed:
            self.room_freed()

    def _flow_times(self, event: str, lane: str) -> str | None:
        """None when this pause or resume goes unlogged (see :data:`FLOW_LOG_S`), else
        what to add to its line: how many there were since the last one logged."""
        counts = self._flow_log[(event, lane)].add(lane)
        if counts is None:
            return None
        n = counts[lane]
        return "" if n == 1 else f" ({n} times since the last such line)"

    def _unpark(self) -> None:
        for parked in self._parked.values():
            if not parked:
                continue
            while parked and self.scheduler.offer(parked[0]):
                parked.popleft()
            if not parked:
                self.room_freed()

    def room_freed(self) -> None:
        """A lane may take records again: wake whoever feeds the runtime."""
        self._on_room()

    def give_up(self) -> list[T]:
        """Take every parked work out (a rebalance gives up what was not started)."""
        out: list[T] = []
        for parked in self._parked.values():
            out.extend(parked)
            parked.clear()
        return out
