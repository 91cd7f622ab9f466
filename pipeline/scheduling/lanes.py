"""Bounded per-lane queues in earliest-deadline-first order, with hysteresis backpressure.

A lane's queue holds at most ``queue_size`` items; :meth:`LaneQueues.offer`
refuses the next one, and the caller pauses that lane's topic. Pausing
cascades downwards: when a lane is at its high-water mark, every lower lane
is paused too, so the model's time goes to the lane that is drowning; the
list of lanes to pause is ordered lowest first, so realtime is paused last.
A paused lane resumes once its queue is down to the low-water mark
(``resume_fraction`` of ``queue_size``) and no lane above it is still paused,
highest lane first.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

__all__ = ["Entry", "LaneQueues", "Queued"]


class Queued(Protocol):
    """What the scheduler reads of a request (the worker's ``Work`` is one).

    ``deadline_ms`` is absolute (the caller resolves lane defaults),
    ``arrived_ms`` is when the worker accepted it, ``tokens`` the length the
    model will see (special tokens included). The scheduler holds requests by
    reference and tells them apart by identity, never by value.
    """

    @property
    def lane(self) -> str: ...
    @property
    def deadline_ms(self) -> int: ...
    @property
    def arrived_ms(self) -> int: ...
    @property
    def tokens(self) -> int: ...


T = TypeVar("T", bound=Queued)


@dataclass(order=True)
class Entry(Generic[T]):
    """An item in its lane's queue; sorts by deadline, then by arrival order."""

    deadline_ms: int
    seq: int
    item: T = field(compare=False)
    bucket: int = field(compare=False)  # index into the sequence-length buckets


class LaneQueues(Generic[T]):
    """The queues of every lane, highest lane first (see the module's promise)."""

    def __init__(
        self,
        lanes: Iterable[str],
        *,
        queue_size: int,
        resume_fraction: float,
        lookahead: int | None = None,
    ) -> None:
        self.lanes: tuple[str, ...] = tuple(lanes)
        #: Entries per lane a decision looks at (:meth:`head`); None: all of them.
        self.lookahead = lookahead
        self.high = queue_size
        self.low = int(queue_size * resume_fraction)
        self._queues: dict[str, list[Entry[T]]] = {lane: [] for lane in self.lanes}
        self._seq = itertools.count()
        self.paused: set[str] = set()
        self.pauses = 0
        self.resumes = 0
        self.rejected: dict[str, int] = dict.fromkeys(self.lanes, 0)
        self._count = 0  # entries queued in all lanes (asked for every offer and decision)

    def __len__(self) -> int:
        return self._count

    def depth(self, lane: str) -> int:
        return len(self._queue(lane))

    def full(self, lane: str) -> bool:
        return self.depth(lane) >= self.high

    def offer(self, item: T, bucket: int) -> bool:
        """Queue ``item`` in deadline order; ``False`` (nothing queued) when its lane is full."""
        queue = self._queue(item.lane)
        if len(queue) >= self.high:
            self.rejected[item.lane] += 1
            return False
        entry = Entry(item.deadline_ms, next(self._seq), item, bucket)
        if not queue or item.deadline_ms >= queue[-1].deadline_ms:
            queue.append(entry)  # the usual place: the latest seq goes after equal deadlines
        else:
            bisect.insort(queue, entry)
        self._count += 1
        return True

    def entries(self, lane: str) -> list[Entry[T]]:
        """The lane's queue in EDF order (the live list: do not mutate)."""
        return self._queue(lane)

    def head(self, lane: str) -> list[Entry[T]]:
        """The first ``lookahead`` entries of the lane's queue in EDF order (a copy): all
        a scheduling decision looks at (see the scheduler's promise)."""
        return self._queue(lane)[: self.lookahead]

    def all_entries(self) -> Iterator[Entry[T]]:
        for lane in self.lanes:
            yield from self._queues[lane]

    def remove(self, taken: Iterable[Entry[T]]) -> None:
        """Drop ``taken`` entries (identity) from their queues."""
        gone: dict[str, set[int]] = {}
        for e in taken:
            gone.setdefault(e.item.lane, set()).add(id(e))
        for lane, ids in gone.items():
            queue = self._queues[lane]
            self._queues[lane] = kept = [e for e in queue if id(e) not in ids]
            self._count -= len(queue) - len(kept)

    def lanes_to_pause(self) -> list[str]:
        """Lanes to pause now, lowest first; each is reported once until resumed."""
        pressed = False
        want: list[str] = []
        for lane in self.lanes:  # highest first: pressure flows down
            pressed = pressed or self.depth(lane) >= self.high
            if pressed and lane not in self.paused:
                want.append(lane)
        self.paused.update(want)
        self.pauses += len(want)
        return want[::-1]

    def lanes_to_resume(self) -> list[str]:
        """Paused lanes that may consume again, highest first; each reported once."""
        want: list[str] = []
        for lane in self.lanes:  # highest first; a lane under a paused one stays paused
            if lane not in self.paused:
                continue
            if self.depth(lane) > self.low:
                break
            want.append(lane)
        self.paused.difference_update(want)
        self.resumes += len(want)
        return want

    def _queue(self, lane: str) -> list[Entry[T]]:
        try:
            return self._queues[lane]
        except KeyError:
            raise ValueError(f"unknown lane {lane!r}; expected one of {self.lanes}") from None
