"""Thread-crossing primitives of the engine: awaitable slots, a busy-time window."""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable

__all__ = ["BusyTracker", "Slots"]


class Slots:
    """A counting semaphore that event loops await and any thread releases."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._lock = threading.Lock()
        self._waiters: collections.deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]
        self._waiters = collections.deque()

    async def acquire(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, fut))
        try:
            await fut
        except asyncio.CancelledError:
            with self._lock:
                if (loop, fut) in self._waiters:
                    self._waiters.remove((loop, fut))
                    raise
            if fut.done() and not fut.cancelled():  # handed a slot, then cancelled
                self.release()
            raise

    def release(self) -> None:
        with self._lock:
            if not self._waiters:
                self._free += 1
                return
            loop, fut = self._waiters.popleft()

        def hand_over() -> None:
            if fut.cancelled():  # its owner gave up: pass the slot on
                self.release()
            elif not fut.done():
                fut.set_result(None)

        try:
            loop.call_soon_threadsafe(hand_over)
        except RuntimeError:  # that loop is closed
            self.release()


class BusyTracker:
    """Busy time / wall time of one thread over a sliding window.

    ``fraction()`` costs O(spans that left the window since the last call):
    the busy time of the spans kept is a running sum, so the batch loop can
    read it after every batch.
    """

    def __init__(self, window_s: float, clock: Callable[[], float]) -> None:
        self._window = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._spans: collections.deque[tuple[float, float]] = collections.deque()
        self._kept = 0.0  # total length of the spans in ``_spans``
        self._since: float | None = None
        self._origin = clock()

    def begin(self) -> None:
        with self._lock:
            self._since = self._clock()

    def end(self) -> None:
        with self._lock:
            if self._since is not None:
                now = self._clock()
                self._spans.append((self._since, now))
                self._kept += now - self._since
                self._since = None

    def fraction(self) -> float:
        with self._lock:
            now = self._clock()
            low = now - self._window
            while self._spans and self._spans[0][1] <= low:
                start, end = self._spans.popleft()
                self._kept -= end - start
            busy = self._kept
            if self._spans and self._spans[0][0] < low:
                busy -= low - self._spans[0][0]  # the part of the oldest span before the window
            if self._since is not None:
                busy += now - max(self._since, low)
            wall = min(self._window, now - self._origin)
        return 0.0 if wall <= 0 else max(0.0, min(1.0, busy / wall))
