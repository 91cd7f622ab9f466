"""Batches by cost: shapes, the plan handed to the engine, and how a batch is assembled.

Cost is padded tokens: rows x the batch's sequence length, where every
request is padded to one of a few sequence-length buckets (8/12/16/.../256),
so one long text does not pad thirty short ones and the engine sees a few
recurring shapes. A batch never holds more than ``max_items`` requests nor
more padded tokens than its budget, except that one request alone always
fits (a text longer than the budget still has to run).

Assembly order, each step in earliest-deadline-first order within a lane:

1. overdue requests of the lower lanes: aged past their lane's max wait, or
   with a deadline that cannot wait for another batch. Those still within
   their bound (``DUE``) come first and get in whatever their length; the
   first one always gets in (so aging wins even when the budget is shrunk)
   and anchors the batch's length; requests already past their bound
   (``LATE``) ride along by length affinity (below). While
   realtime work is pending they leave room for it (items and padded tokens,
   counted at the sequence length realtime would pad to): the room the
   pending realtime requests need, at least ``realtime_share`` of the batch
   and one row, at most ``1 - realtime_share`` of it (or ``realtime_share``,
   if larger), so each side keeps a share when both flood;
2. realtime, any length;
3. overdue requests again, in the room realtime left unused;
4. standard, then bulk, by length affinity to the batch's (or the first
   request's) bucket: first requests in that bucket, then requests of other
   buckets, nearest first. With a cost model (``cost_ms``: the controller's
   latency model, learned from the device) one joins only if it does not
   raise the batch's predicted time per real token: its own tokens must pay
   for the padding it adds (its rows up to a longer one's length, or the
   whole batch up to its own), so where a batch's fixed cost dominates (a
   GPU's launch, a small batch) lengths mix freely, and where every padded
   token costs (a device that is the bottleneck, a full batch) a batch keeps
   to nearly one length, as the model alone does with the whole workload
   sorted. Nor may it add more time than its share of a batch of its own
   bucket's pending requests would take: short texts padded up to a long
   realtime request's length lower the batch's time per real token (they
   share its fixed cost) but cost more than the batch they could lead.
   Without one, requests one bucket away join while the batch stays
   at most half padding. Those left out lead a batch of their own later.

Under a backlog, steps 1 and 2 follow length too. When more overdue requests
are pending than one batch holds (their lanes' aging bounds cannot all be
kept), the one with the earliest deadline, late or not, anchors the batch and
the others join by length as in step 4; when more realtime is pending than one
batch holds, the most urgent and those that cannot wait for the next batch get
in, the others by length (with a cost model). Otherwise both go in whatever
their length.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from pipeline.scheduling.lanes import Entry, LaneQueues, Queued

__all__ = ["DUE", "LATE", "ON_TIME", "Draft", "Plan", "Shapes", "assemble"]

T = TypeVar("T", bound=Queued)

#: Requests one bucket away join only while the batch stays under this padding.
MAX_AFFINITY_PADDING = 0.5

#: What ``overdue`` says of a request: not overdue; overdue but already past
#: its bound (late, no batch can save it: it rides by length affinity); overdue
#: and still within its bound (it goes now, whatever its length).
ON_TIME, LATE, DUE = 0, 1, 2


class Shapes:
    """Rounds sequence lengths and batch sizes to a few buckets."""

    def __init__(self, seq_buckets: Sequence[int], max_items: int) -> None:
        self.seq_buckets = tuple(seq_buckets)
        sizes = [1 << i for i in range(max_items.bit_length()) if 1 << i < max_items]
        self.batch_buckets = (*sizes, max_items)

    def seq_index(self, tokens: int) -> int:
        """Index of the smallest bucket holding ``tokens`` (the last one truncates)."""
        return min(bisect.bisect_left(self.seq_buckets, tokens), len(self.seq_buckets) - 1)

    def seq_len(self, index: int) -> int:
        return self.seq_buckets[index]

    def batch_shape(self, rows: int) -> int:
        """The smallest batch bucket (powers of two, then ``max_items``) holding ``rows``."""
        return self.batch_buckets[
            min(bisect.bisect_left(self.batch_buckets, rows), len(self.batch_buckets) - 1)
        ]


@dataclass(frozen=True)
class Plan(Generic[T]):
    """What to do now: run ``items`` as one batch; dead-letter ``expired`` (never run them).

    ``items`` is ordered by lane, then deadline (EDF). ``seq_len`` is the
    bucketed sequence length to pad to and ``batch_shape`` the bucketed row
    count (an engine reusing memory pads rows up to it; the budget counts the
    real rows). ``padded_tokens`` is ``len(items) x seq_len``, ``real_tokens``
    the tokens the requests really have, ``budget`` the budget this batch was
    cut to, ``predicted_ms`` its expected run time. ``reason`` says why it was
    dispatched now: ``deadline``, ``aged``, ``full``, ``window``, or
    ``expired`` when the plan only carries expired requests (``items`` empty).
    """

    items: list[T]
    expired: list[T]
    seq_len: int
    batch_shape: int
    real_tokens: int
    padded_tokens: int
    budget: int
    reason: str
    predicted_ms: float = 0.0

    @property
    def padding_ratio(self) -> float:
        """Share of the computed positions that are padding, in [0, 1)."""
        return 1.0 - self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0


class Draft(Generic[T]):
    """A batch being assembled under a token budget and an item cap."""

    def __init__(self, shapes: Shapes, *, budget: int, max_items: int) -> None:
        self.shapes = shapes
        self.budget = budget
        self.max_items = max_items
        self.entries: list[Entry[T]] = []
        self.index = -1  # bucket index of the longest entry
        self.real = 0
        self._taken: set[int] = set()

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, entry: Entry[T]) -> bool:
        return id(entry) in self._taken

    @property
    def seq_len(self) -> int:
        return self.shapes.seq_len(self.index) if self.entries else 0

    @property
    def padded(self) -> int:
        return len(self.entries) * self.seq_len

    def real_tokens(self, entry: Entry[T]) -> int:
        return min(entry.item.tokens, self.shapes.seq_len(entry.bucket))

    def cost_with(self, entry: Entry[T]) -> tuple[int, int]:
        """(padded, real) tokens of the batch if ``entry`` joined."""
        seq = self.shapes.seq_len(max(self.index, entry.bucket))
        return (len(self.entries) + 1) * seq, self.real + self.real_tokens(entry)

    def fits(self, entry: Entry[T], *, budget: int | None = None, items: int | None = None) -> bool:
        """Whether ``entry`` may join within the caps (an empty batch takes anything)."""
        if entry in self:
            return False
        if not self.entries:
            return True
        padded, _ = self.cost_with(entry)
        cap_items = self.max_items if items is None else items
        cap_tokens = self.budget if budget is None else budget
        return len(self.entries) < cap_items and padded <= cap_tokens

    def add(self, entry: Entry[T]) -> None:
        self.entries.append(entry)
        self._taken.add(id(entry))
        self.index = max(self.index, entry.bucket)
        self.real += self.real_tokens(entry)

    @property
    def full(self) -> bool:
        """No room for one more request of the batch's own length."""
        if len(self.entries) >= self.max_items:
            return True
        return bool(self.entries) and self.padded + self.seq_len > self.budget


def assemble(
    queues: LaneQueues[T],
    shapes: Shapes,
    *,
    budget: int,
    max_items: int,
    realtime_share: float,
    urgency: Mapping[int, int],
    heads: Mapping[str, list[Entry[T]]] | None = None,
    cost_ms: Callable[[int], float] | None = None,
    urgent_ms: float = -math.inf,
) -> Draft[T]:
    """Assemble the batch that would run now (see the module's promise) from ``heads``
    (each lane's queue, or the part of it to look at); ``urgency`` says, by ``id``, how
    overdue each request of the lower lanes there is (``LATE``, ``DUE``; one it does not
    name is ``ON_TIME``);
    ``cost_ms``: a batch's predicted time from its padded tokens (None: the padding
    rule); ``urgent_ms``: a realtime request due before it cannot wait for the next
    batch. Mutates nothing."""
    top, *others = queues.lanes
    if heads is None:
        heads = {lane: queues.entries(lane) for lane in queues.lanes}
    draft: Draft[T] = Draft(shapes, budget=budget, max_items=max_items)
    realtime = heads[top]
    # Keys of plain ints (an Entry sorts by deadline, then arrival): compared in C, where
    # the Entry's own ordering called a Python method for every comparison.
    late = sorted(
        (e for lane in others for e in heads[lane] if urgency.get(id(e), ON_TIME)),
        key=lambda e: (-urgency[id(e)], e.deadline_ms, e.seq),
    )
    reserve = bool(realtime) and realtime_share > 0
    items_cap, rt_rows, rt_bucket = max_items, 0, -1
    if reserve:
        # Realtime's room: what its pending requests need, within [share, 1 - share]. A
        # fixed share alone left a second realtime request (a batch of ~200 tokens while
        # realtime flows has one 25 % row) to wait a whole batch behind aged requests.
        share_rows = max(1, math.ceil(realtime_share * max_items))
        rt_rows = min(len(realtime), max(share_rows, max_items - share_rows))
        items_cap = max_items - max(rt_rows, share_rows)
        rt_bucket = max(e.bucket for e in realtime[:rt_rows])
    share_tokens = int(realtime_share * budget)
    # More overdue requests than one batch holds (a backlog past its lanes' aging bounds,
    # which no batch can keep for all): the batch is anchored at the overdue request with
    # the earliest deadline, late or not (so none waits forever), and the others join by
    # length, as the rest do in step 4: it then serves more of them. Taken in deadline
    # order whatever their length, such batches were 0.5-0.86 padding (the bench's
    # saturated phase replayed through the scheduler at the slow device's cost).
    crowd = _crowded(late, shapes, budget, max_items)
    if crowd:
        late.sort(key=_edf)
        late[1:] = _nearest_first(late[1:], late[0].bucket)
    anchor = late[0].bucket if late else -1

    def joins(e: Entry[T]) -> bool:
        return (urgency.get(id(e)) == DUE and not crowd) or _affine(draft, e, anchor, cost_ms)

    for e in late:  # 1
        if not draft.entries:
            draft.add(e)  # the most urgent overdue request always gets in
        elif not reserve:
            if not draft.full and draft.fits(e) and joins(e):
                draft.add(e)
        else:
            seq = shapes.seq_len(max(draft.index, e.bucket, rt_bucket))
            room = min(rt_rows * seq, max(share_tokens, budget - share_tokens))
            tokens_cap = budget - max(share_tokens, seq, room)
            rows = len(draft) + 1
            if rows <= items_cap and rows * seq <= tokens_cap and joins(e):
                draft.add(e)
    _fill_realtime(draft, realtime, cost_ms=cost_ms, urgent_ms=urgent_ms)  # 2
    _fill(draft, (e for e in late if joins(e)))  # 3
    taken = draft._taken
    rest = [e for lane in others for e in heads[lane] if id(e) not in taken]
    if not rest or draft.full:
        return draft
    if not draft.entries:
        draft.add(rest[0])  # the anchor: earliest deadline of the highest lane
    anchor = draft.index
    _fill(draft, (e for e in rest if e.bucket == anchor))  # 4a
    if draft.full:
        return draft
    if cost_ms is None:
        near = [e for e in rest if abs(e.bucket - anchor) == 1]
        _fill(draft, (e for e in near if _affine(draft, e, anchor, None)))  # 4b
    else:
        _fill_by_length(draft, rest, anchor, cost_ms)  # 4b
    return draft


def _fill_realtime(
    draft: Draft[T],
    realtime: list[Entry[T]],
    *,
    cost_ms: Callable[[int], float] | None,
    urgent_ms: float,
) -> None:
    """Step 2: realtime in deadline order, any length; but with more pending than one
    batch holds (some waits for the next batch whatever this one takes), those that
    cannot wait (a deadline before ``urgent_ms``) and the most urgent get in, the others
    by length, so a long text does not pad thirty short ones (9 rows of 192 tokens,
    0.8 padding, on the simulated slow device)."""
    if cost_ms is None or not _crowded(realtime, draft.shapes, draft.budget, draft.max_items):
        _fill(draft, realtime)
        return
    _fill(draft, (e for e in realtime if e is realtime[0] or e.deadline_ms < urgent_ms))
    near = _nearest_first(realtime, draft.index)
    _fill(draft, (e for e in near if _affine(draft, e, draft.index, cost_ms)))


def _fill_by_length(
    draft: Draft[T], rest: list[Entry[T]], anchor: int, cost_ms: Callable[[int], float]
) -> None:
    """Step 4b with a cost model: requests of other buckets, nearest first, on each side
    until a bucket admits none (one farther pads more, or brings fewer tokens). One joins
    only if it adds no more time to this batch than its share of a batch of its own
    bucket's pending requests would take (:func:`_share_ms`): its rows padded up to a long
    realtime request's length cost more than the batch of short texts it could lead."""
    by_bucket: dict[int, list[Entry[T]]] = {}
    for e in rest:
        if e.bucket != anchor:
            by_bucket.setdefault(e.bucket, []).append(e)
    for side in sorted(by_bucket, key=lambda b: (abs(b - anchor), b)):
        if draft.full:
            return
        rows = len(draft)
        share = _share_ms(draft, side, len(by_bucket[side]), cost_ms)
        _fill(draft, (e for e in by_bucket[side] if _affine(draft, e, anchor, cost_ms, share)))
        if len(draft) == rows:
            for b in [b for b in by_bucket if (b - anchor) * (side - anchor) > 0]:
                by_bucket[b] = []


def _share_ms(draft: Draft[T], bucket: int, pending: int, cost_ms: Callable[[int], float]) -> float:
    """Predicted time of one request's share of a batch of ``pending`` requests of
    ``bucket`` alone (as many as one batch holds)."""
    seq = draft.shapes.seq_len(bucket)
    rows = max(1, min(pending, draft.max_items, draft.budget // seq))
    return cost_ms(rows * seq) / rows


def _edf(e: Entry[T]) -> tuple[int, int]:
    """An entry's place in deadline order (as its own ordering, in plain ints)."""
    return e.deadline_ms, e.seq


def _nearest_first(entries: Iterable[Entry[T]], anchor: int) -> list[Entry[T]]:
    """``entries`` by their bucket's distance from ``anchor``, in their order within one."""
    return sorted(entries, key=lambda e: abs(e.bucket - anchor))


def _crowded(entries: Sequence[Entry[T]], shapes: Shapes, budget: int, max_items: int) -> bool:
    """Whether ``entries`` are more than one batch holds, padded to the longest of them."""
    if len(entries) > max_items:
        return True
    return bool(entries) and len(entries) * shapes.seq_len(max(e.bucket for e in entries)) > budget


def _affine(
    draft: Draft[T],
    entry: Entry[T],
    anchor: int,
    cost_ms: Callable[[int], float] | None,
    share_ms: float = math.inf,
) -> bool:
    """Whether ``entry`` is close enough in length to ride with a batch anchored at
    bucket ``anchor``: the same bucket; with ``cost_ms``, any bucket while the batch's
    predicted time per real token does not rise and the time it adds is at most
    ``share_ms`` (:func:`_share_ms`); without, one bucket away while the batch stays at
    most ``MAX_AFFINITY_PADDING`` padding."""
    if entry.bucket == anchor:
        return True
    padded, real = draft.cost_with(entry)
    if cost_ms is not None:
        if not draft.entries:
            return True
        now = cost_ms(draft.padded)
        return cost_ms(padded) * draft.real <= now * real and cost_ms(padded) - now <= share_ms
    if abs(entry.bucket - anchor) != 1:
        return False
    return 1 - real / padded <= MAX_AFFINITY_PADDING


def _fill(draft: Draft[T], entries: Iterable[Entry[T]]) -> None:
    for e in entries:
        if draft.full:
            return
        if draft.fits(e):
            draft.add(e)
