"""A simple bounded batcher: up to ``max_size`` items or ``max_wait_ms`` after the first.

Higher lanes are taken first (a priority queue by lane rank, FIFO within a
lane). The adaptive, deadline-aware scheduler replaces this in a later stage;
the interface (``put`` / ``next_batch``) stays.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Batcher"]

W = TypeVar("W")


class Batcher(Generic[W]):
    """Bounded queue of work that hands out batches.

    Promises: ``put`` waits while ``queue_size`` items are queued (that is the
    backpressure that pauses intake); ``next_batch`` returns 1..max_size items,
    never waiting more than ``max_wait_ms`` once the first item is there.
    """

    def __init__(
        self,
        *,
        max_size: int,
        max_wait_ms: int,
        queue_size: int,
        rank: Callable[[W], int],
    ) -> None:
        if max_size < 1 or queue_size < 1:
            raise ValueError("max_size and queue_size must be at least 1")
        self.max_size = max_size
        self.max_wait_s = max_wait_ms / 1000
        self._rank = rank
        self._seq = itertools.count()
        self._queue: asyncio.PriorityQueue[tuple[int, int, W]] = asyncio.PriorityQueue(queue_size)

    def __len__(self) -> int:
        return self._queue.qsize()

    async def put(self, item: W) -> None:
        await self._queue.put((self._rank(item), next(self._seq), item))

    async def next_batch(self) -> list[W]:
        loop = asyncio.get_running_loop()
        *_, first = await self._queue.get()
        batch = [first]
        deadline = loop.time() + self.max_wait_s
        while len(batch) < self.max_size:
            if self._queue.empty():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    *_, item = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
            else:
                *_, item = self._queue.get_nowait()
            batch.append(item)
        return batch
