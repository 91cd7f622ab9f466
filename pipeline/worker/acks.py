"""Per-partition, in-order acknowledgement: only a contiguous prefix is released.

faust-streaming 0.15.3 can commit past an earlier unacknowledged offset when
acks arrive out of order (faust-streaming issue #606). Results finish out of
order (batches, retries, stored hits), so the worker keeps its own watermark:
an offset is handed to Faust only once it and every earlier tracked offset of
its partition are done.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["OffsetWatermark"]

T = TypeVar("T")


class OffsetWatermark(Generic[T]):
    """Tracks offsets per partition in arrival order and releases them in order.

    Promises: ``done`` returns tokens in offset order per partition, each
    exactly once, and never a token while an earlier offset of its
    partition is still pending.
    """

    def __init__(self) -> None:
        # partition -> offset -> [token, finished]
        self._pending: dict[Hashable, OrderedDict[int, list[object]]] = {}

    def track(self, partition: Hashable, offset: int, token: T) -> None:
        """Register an offset as it arrives; offsets must increase per partition."""
        queue = self._pending.get(partition)
        if queue is None:  # not setdefault: that would make a dict per call
            queue = self._pending[partition] = OrderedDict()
        elif queue:
            last = next(reversed(queue))
            if offset <= last:
                raise ValueError(f"offset {offset} of {partition} arrived after {last}")
        queue[offset] = [token, False]

    def done(self, partition: Hashable, offset: int) -> list[T]:
        """Mark an offset finished; return the tokens now safe to acknowledge, in order."""
        queue = self._pending.get(partition)
        if queue is None or offset not in queue:
            return []  # forgotten by a rebalance, or already released
        queue[offset][1] = True
        released: list[T] = []
        while queue:
            first = next(iter(queue))
            token, finished = queue[first]
            if not finished:
                break
            del queue[first]
            released.append(token)  # type: ignore[arg-type]
        return released

    def tokens_from(self, partition: Hashable, offset: int) -> list[T]:
        """Tokens of the partition's pending offsets from ``offset`` on, in order."""
        queue = self._pending.get(partition, OrderedDict())
        return [entry[0] for o, entry in queue.items() if o >= offset]  # type: ignore[misc]

    def forget(self, partition: Hashable) -> int:
        """Drop a partition's pending offsets (after it was revoked); return how many."""
        return len(self._pending.pop(partition, ()))

    def pending(self, partition: Hashable | None = None) -> int:
        """Offsets tracked but not yet released (in one partition, or in all)."""
        if partition is not None:
            return len(self._pending.get(partition, ()))
        return sum(len(q) for q in self._pending.values())
