"""Admission: how much a lane may hold, and in which order its inputs are released.

An input is *admitted* when the worker takes it on and *released* once its
answer is safely in Kafka. Between the two it counts against its lane's bounds,
in records and in bytes (so a burst of large records cannot hold gigabytes),
and it holds the per-partition watermark: :meth:`Admission.release` returns the
tokens safe to acknowledge, a contiguous prefix per partition, in offset order.

The caller asks :meth:`Admission.has_room` and then holds the input with
:meth:`Admission.hold`; waiting for room is the caller's business (``on_room``
tells it when a lane frees some).

When a rebalance starts, :meth:`Admission.give_up` abandons inputs that were
admitted but not started (named by the caller). A partition's inputs from the
first abandoned one on can no longer be released in this assignment: their
tokens are returned so the caller can tell Faust to stop waiting for them;
their offsets stay uncommitted and are read again by the partition's next owner.
Until the partition is forgotten (revoked), :meth:`Admission.hold` refuses its
later records too: behind an abandoned offset they could never be released,
and Faust would wait for them forever.

Pure: no Faust, no Kafka; the clock is injected.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from pipeline.worker.acks import OffsetWatermark

__all__ = ["Admission", "LaneBounds"]

T = TypeVar("T")


@dataclass(frozen=True)
class LaneBounds:
    """Most inputs, and most bytes of their values, a lane may hold at once.

    One input is always admitted into an empty lane, whatever its size, so a
    record larger than ``max_bytes`` waits for its lane to drain, never forever.
    """

    max_records: int
    max_bytes: int


@dataclass
class _Held:
    lane: str
    size: int
    since_ms: int


class Admission(Generic[T]):
    """Per-lane bounds and the offset watermark (see the module's promise)."""

    def __init__(
        self,
        lanes: Iterable[str],
        bounds: LaneBounds,
        *,
        clock_ms: Callable[[], int],
        on_room: Callable[[], None] = lambda: None,
    ) -> None:
        self.bounds = bounds
        self.watermark: OffsetWatermark[T] = OffsetWatermark()
        self._clock_ms = clock_ms
        self._on_room = on_room  # called whenever a lane frees room
        self._lanes = tuple(lanes)
        self._records = dict.fromkeys(self._lanes, 0)
        self._bytes = dict.fromkeys(self._lanes, 0)
        self._held: dict[tuple[Hashable, int], _Held] = {}  # in admission order
        self._abandoned: set[Hashable] = set()  # given up on, not yet forgotten

    # -- bounds ---------------------------------------------------------------

    def has_room(self, lane: str, size: int) -> bool:
        """Whether ``lane`` may hold one more input of ``size`` bytes within its bounds
        (always, when it holds nothing)."""
        records, held = self._records[lane], self._bytes[lane]
        if records == 0:
            return True
        return records < self.bounds.max_records and held + size <= self.bounds.max_bytes

    def hold(self, lane: str, partition: Hashable, offset: int, size: int, token: T) -> bool:
        """Hold the input now, room or not (the caller asked :meth:`has_room`); False
        (not held) when its partition was given up and not yet forgotten.

        A partition whose offsets went backwards (handed back from its last
        commit by a rebalance) is forgotten first: what was held is read again.
        """
        if partition in self._abandoned:
            return False
        try:
            self.watermark.track(partition, offset, token)
        except ValueError:
            self.forget(partition)
            self.watermark.track(partition, offset, token)
        self._held[(partition, offset)] = _Held(lane, size, self._clock_ms())
        self._records[lane] += 1
        self._bytes[lane] += size
        return True

    def release(self, partition: Hashable, offset: int) -> list[T]:
        """The input is answered: free its room; return the tokens now safe to ack."""
        self._unhold(partition, offset)
        return self.watermark.done(partition, offset)

    def _unhold(self, partition: Hashable, offset: int) -> None:
        held = self._held.pop((partition, offset), None)
        if held is None:
            return  # forgotten by a rebalance, or released already
        self._records[held.lane] -= 1
        self._bytes[held.lane] -= held.size
        self._on_room()

    # -- rebalances -------------------------------------------------------------

    def give_up(self, unstarted: Iterable[tuple[Hashable, int]]) -> list[T]:
        """Abandon ``unstarted`` inputs (partition, offset); return the tokens Faust
        must stop waiting for: per partition, those of the first abandoned offset and
        every later one held."""
        first: dict[Hashable, int] = {}
        for partition, offset in unstarted:
            if (partition, offset) in self._held:
                first[partition] = min(offset, first.get(partition, offset))
                self._unhold(partition, offset)
        self._abandoned.update(first)
        stranded: list[T] = []
        for partition, low in first.items():
            stranded.extend(self.watermark.tokens_from(partition, low))
        return stranded

    def forget(self, partition: Hashable) -> int:
        """The partition was revoked (or rewound): drop what it held; return how many."""
        for key in [k for k in self._held if k[0] == partition]:
            self._unhold(*key)
        self._abandoned.discard(partition)
        return self.watermark.forget(partition)

    # -- gauges -----------------------------------------------------------------

    def pending(self) -> int:
        """Inputs admitted and not yet released, over every lane."""
        return self.watermark.pending()

    def oldest_ms(self) -> int:
        """How long the oldest input admitted and not yet answered has waited (0: none)."""
        for held in self._held.values():
            return max(0, self._clock_ms() - held.since_ms)
        return 0
