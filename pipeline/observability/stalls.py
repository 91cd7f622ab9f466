"""Stalls of the event loop, measured: a timer probe and the garbage collector's pauses.

While the loop stands still nothing is taken in, scheduled or answered, and
a realtime request's 200 ms budget goes with it. :class:`StallWatch` records

- the loop's lag: how much later than asked a ``interval_s`` sleep returns
  (``pipeline_event_loop_lag_seconds``; a lag over ``warn_s`` is also logged,
  once per kind of record thanks to the log's repeat filter);
- every garbage collection's pause, by generation (``pipeline_gc_pause_seconds``),
  from ``gc.callbacks``: a full collection once stopped a worker for 290 ms
  before the start-up objects were frozen (``gc.freeze()`` in ``app.py``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from typing import Any

from pipeline.observability.metrics import PipelineMetrics

__all__ = ["StallWatch"]

log = logging.getLogger(__name__)


class StallWatch:
    """Feeds loop lag and GC pauses to ``metrics``; ``install`` hooks the collector,
    ``run`` is the timer probe (a task), ``close`` unhooks."""

    def __init__(
        self,
        metrics: PipelineMetrics,
        *,
        interval_s: float = 0.1,
        warn_s: float = 0.1,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.metrics = metrics
        self.interval_s = interval_s
        self.warn_s = warn_s
        self._clock = clock
        self._gc_started: dict[int, float] = {}
        self._closed = False

    def install(self) -> None:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def close(self) -> None:
        """Unhook; from now on stalls are measured but not logged (a stopping worker
        blocks its loop on purpose, closing what it holds)."""
        self._closed = True
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    async def run(self) -> None:
        while True:
            t0 = self._clock()
            await asyncio.sleep(self.interval_s)
            lag = self._clock() - t0 - self.interval_s
            self.metrics.loop_lag(lag)
            if lag > self.warn_s and not self._closed:
                log.warning("event loop stalled for %.0f ms", lag * 1000)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # Runs on whichever thread triggered the collection; it must never raise.
        generation = int(info.get("generation", 0))
        if phase == "start":
            self._gc_started[generation] = self._clock()
        elif (t0 := self._gc_started.pop(generation, None)) is not None:
            self.metrics.gc_pause(generation, self._clock() - t0)
