"""Realtime triage: which realtime requests can still make their deadline, batch by batch.

Pure: a plan over queued entries, a start time and a latency model, no clock.

:func:`triage` lays the realtime requests (in deadline order) out into the
batches the engine would run from ``start_ms`` on, one after the other. Each
batch is anchored at the earliest request that can still finish in time if
it ran alone then; the others join it in deadline order while the batch,
predicted, still ends ``margin_ms`` before the anchor's deadline (the
earliest in the batch), within ``max_items`` and ``max_tokens``. Every row
pads to the batch's longest request, so the batch is capped at a sequence
length: of the caps from the anchor's length up, the one that lets the most
requests in (those longer than it wait); where the anchor itself is the long
one, a batch of shorter requests runs first when it holds more and leaves the
anchor time to run alone right after. Those left out wait for the next
batch, which starts when this one is predicted to end. A request that cannot finish in time even
alone, at the start of the batch it would get, is hopeless; that start and its
run alone are judged on ``alone_ms`` (the model's own prediction), while the
batches are laid out on ``predict_ms`` (the caller's caution: the overrun),
so a caution the engine does not repeat never rejects. The caller
expires a hopeless request now, before its deadline, so that its client hears of it while a
retry elsewhere can still help (Triton's REJECT), instead of letting it take
a row another request could have finished in.

Earliest deadlines first and batches as large as their deadline allows: a
batch's fixed cost is paid once for all its rows, so the fewer, fuller
batches finish the most requests by a common deadline (issue 31: a burst's
realtime in batches of 8 ran at ~160 texts/s where the best batch gives
~230/s, and half of what could have been finished expired).

Beyond capacity (that layout leaves requests hopeless), long requests give way:
for each sequence length, the requests up to it are laid out first (earliest
deadlines first among them) and the longer ones after them, and the layout
that finishes the most wins, earliest deadlines first alone on a tie. A long
text takes the time of many short rows, so when not all can make it, finishing
the short ones finishes the most (the rule of Moore and Hodgson for one machine,
which gives up the longest job whenever one would be late, here over the
32 lengths rather than job by job). On the bench's burst of 1,000, replayed
through the scheduler at a CPU's cost, a 102-token text ran alone for 35 ms
while 24 short ones expired; with the rule 26 on time became 35.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pipeline.scheduling.budget import Shapes
from pipeline.scheduling.lanes import Entry, Queued

__all__ = ["MAX_BATCHES", "Triage", "triage"]

T = TypeVar("T", bound=Queued)

#: Batches a triage lays out at most; requests past them are judged in later decisions.
MAX_BATCHES = 8

#: Length caps a triage beyond capacity tries at most (:func:`_caps`).
CAPS = 16


@dataclass
class Triage(Generic[T]):
    """The layout: ``batches`` (entries per batch, the first runs next), ``hopeless``
    (cannot make it in any), ``rest`` (past ``MAX_BATCHES``: not judged)."""

    batches: list[list[Entry[T]]] = field(default_factory=list)
    padded: list[int] = field(default_factory=list)  # padded tokens of each batch
    starts: list[float] = field(default_factory=list)  # when each batch is predicted to start
    hopeless: list[Entry[T]] = field(default_factory=list)
    rest: list[Entry[T]] = field(default_factory=list)
    end_ms: float = 0.0  # when the last batch is predicted to end
    #: When it ends by the rejection's own prediction (``alone_ms``): the clock that
    #: judges hopeless, apart from the one batches are laid out on.
    own_end_ms: float = 0.0

    @property
    def on_time(self) -> int:
        """Requests the layout finishes within their deadline."""
        return sum(len(b) for b in self.batches)

    def slack_ms(self, shapes: Shapes, alone_ms: Callable[[int], float]) -> float:
        """How much later than planned the layout may start before a request it holds
        could no longer finish even alone at its batch's start (``alone_ms``, as the
        rejection judged it): until then no request laid out turns hopeless, unless
        the layout itself changes (``inf`` when it holds none)."""
        return min(
            (
                e.deadline_ms - t - alone_ms(shapes.seq_len(e.bucket))
                for t, batch in zip(self.starts, self.batches, strict=True)
                for e in batch
            ),
            default=math.inf,
        )


def triage(
    entries: Sequence[Entry[T]],
    shapes: Shapes,
    *,
    start_ms: float,
    predict_ms: Callable[[int], float],
    max_items: int,
    max_tokens: int,
    margin_ms: float,
    alone_ms: Callable[[int], float] | None = None,
    give_way: bool = True,
) -> Triage[T]:
    """Lay ``entries`` (deadline order) out into batches from ``start_ms`` (see the
    module's promise). Mutates nothing. ``alone_ms`` (default ``predict_ms``) judges
    whether a request could finish alone, so is hopeless: the caller may size batches
    on a more cautious prediction than it rejects on. ``give_way`` False: earliest
    deadlines first alone, without the length rule."""
    lay = functools.partial(
        _earliest_first, shapes=shapes, predict_ms=predict_ms, max_items=max_items,
        max_tokens=max_tokens, margin_ms=margin_ms,
        alone=predict_ms if alone_ms is None else alone_ms,
    )  # fmt: skip
    best = lay(list(entries), start_ms=float(start_ms), batches=MAX_BATCHES)
    if not give_way or not best.hopeless:
        return best
    # Beyond capacity: the requests up to each length first, the longer ones after
    # them; the cap that finishes the most wins (earliest deadlines first on a tie).
    for cap in _caps(entries):
        short = [e for e in entries if e.bucket <= cap]
        longer = [e for e in entries if e.bucket > cap]
        first = lay(short, start_ms=float(start_ms), batches=MAX_BATCHES)
        if first.on_time + len(longer) <= best.on_time:
            continue  # even every longer request on time after them would not win
        then = lay(
            longer, start_ms=first.end_ms, own_start_ms=first.own_end_ms,
            batches=MAX_BATCHES - len(first.batches),
        )  # fmt: skip
        if first.on_time + then.on_time > best.on_time:
            best = _join(first, then)
    return best


def _caps(entries: Sequence[Entry[T]]) -> list[int]:
    """The lengths (bucket indexes) to try as caps, short to long, the longest left out
    (a cap there is no cap): about ``CAPS`` of them, each letting a ``1 / CAPS`` share
    more requests in than the one before, so a decision lays out at most ``2 x CAPS``
    more layouts (with 84 requests over 25 lengths, a cap at every length took 10 ms)."""
    counts: dict[int, int] = {}
    for e in entries:
        counts[e.bucket] = counts.get(e.bucket, 0) + 1
    step, taken, last, out = max(1, len(entries) // CAPS), 0, 0, []
    for bucket in sorted(counts)[:-1]:
        taken += counts[bucket]
        if taken - last >= step:
            out.append(bucket)
            last = taken
    return out


def _join(first: Triage[T], then: Triage[T]) -> Triage[T]:
    return Triage(
        batches=first.batches + then.batches, padded=first.padded + then.padded,
        starts=first.starts + then.starts, hopeless=first.hopeless + then.hopeless,
        rest=first.rest + then.rest, end_ms=then.end_ms if then.batches else first.end_ms,
        own_end_ms=then.own_end_ms if then.batches else first.own_end_ms,
    )  # fmt: skip


def _earliest_first(
    entries: list[Entry[T]],
    *,
    start_ms: float,
    batches: int,
    shapes: Shapes,
    predict_ms: Callable[[int], float],
    max_items: int,
    max_tokens: int,
    margin_ms: float,
    alone: Callable[[int], float],
    own_start_ms: float | None = None,
) -> Triage[T]:
    """Earliest deadlines first: each batch anchored at the earliest request that can
    still finish alone (:func:`_batch`), at most ``batches`` of them.

    Batches are sized and laid out on ``predict_ms`` (the caller's caution); whether a
    request can still finish alone is judged on ``alone`` for it and for the batches
    before it, from ``own_start_ms`` (default ``start_ms``): the caution never
    rejects. Judged at the cautious starts, a burst of 300's longest realtime text was
    rejected with 114 ms left where the model's own prediction finished it by 97 ms
    (two 80-token texts behind seven short ones, at an overrun of 1.4). Mutates nothing."""
    own = start_ms if own_start_ms is None else own_start_ms
    out: Triage[T] = Triage(end_ms=start_ms, own_end_ms=own)
    rest = entries
    t = start_ms
    counts: dict[int, int] = {}  # requests of ``rest`` per bucket
    for e in rest:
        counts[e.bucket] = counts.get(e.bucket, 0) + 1
    while rest and len(out.batches) < batches:
        late = 0  # how many at the front are too late even alone, now and later
        while late < len(rest) and (
            own + alone(shapes.seq_len(rest[late].bucket)) > rest[late].deadline_ms
        ):
            late += 1
        if late:
            out.hopeless += rest[:late]
            _discount(counts, rest[:late])
            rest = rest[late:]
        if not rest:
            break
        batch, rest = _batch(
            rest, counts, shapes, t, predict_ms=predict_ms, max_items=max_items,
            max_tokens=max_tokens, margin_ms=margin_ms,
        )  # fmt: skip
        _discount(counts, batch)
        padded = len(batch) * shapes.seq_len(max(e.bucket for e in batch))
        out.batches.append(batch)
        out.padded.append(padded)
        out.starts.append(t)
        t += predict_ms(padded)
        own += alone(padded)
    out.rest = rest
    out.end_ms = t
    out.own_end_ms = own
    return out


def _discount(counts: dict[int, int], gone: list[Entry[T]]) -> None:
    for e in gone:
        counts[e.bucket] -= 1


def _batch(
    rest: list[Entry[T]],
    counts: dict[int, int],
    shapes: Shapes,
    t: float,
    *,
    predict_ms: Callable[[int], float],
    max_items: int,
    max_tokens: int,
    margin_ms: float,
) -> tuple[list[Entry[T]], list[Entry[T]]]:
    """The most requests of ``rest`` that one batch from ``t`` finishes before the
    deadline of ``rest[0]`` (the anchor, the earliest) less the margin: for each
    sequence length from the anchor's up, the earliest requests no longer than it,
    as many as fit; the length that fits most wins (the shorter on a tie). The
    anchor is in (it fits alone: the caller made sure), unless a batch of shorter
    requests holds more, the anchor counted, and still leaves it the time to run
    alone right after: every row pads to the batch's longest, so a long anchor
    would otherwise pad the short requests of a burst made at about the same
    moment (one 128-token text held a batch of 3 where 17 short ones fitted).
    Returns the batch and the rest of ``rest`` (its order kept)."""
    anchor = rest[0]
    # How many requests of ``rest`` each length cap admits (from ``counts``, its requests
    # per bucket): a batch capped at ``b`` holds the first min(rows, that many); only the
    # winner is picked out. (Picking each cap's requests out by scanning ``rest`` cost a
    # no-op worker's flooded realtime ~70 scans per decision, a tenth of its main thread.)
    admitted: dict[int, int] = {}
    total = 0
    for bucket in sorted(counts):
        if counts[bucket]:
            total += counts[bucket]
            admitted[bucket] = total
    best, best_n = anchor.bucket, 1  # the anchor alone
    room = anchor.deadline_ms - t - margin_ms
    admits = functools.partial(_admits, shapes, predict_ms=predict_ms, max_items=max_items,
                               max_tokens=max_tokens)  # fmt: skip
    for bucket, n_le in admitted.items():
        if bucket < anchor.bucket or n_le <= best_n:
            continue  # (rows only fall as the cap grows: skipping ends no search early)
        n, every_row = admits(bucket, room, n_le)
        n = max(n, 1)  # the anchor fits alone: the caller made sure
        if n > best_n:
            best, best_n = bucket, n
        if every_row:
            break  # a longer cap holds no more rows, and these are already in
    # Shorter requests first, the anchor after them: it must still fit alone then.
    after = room - predict_ms(shapes.seq_len(anchor.bucket))
    for bucket, n_le in admitted.items():
        if bucket >= anchor.bucket:
            break
        if n_le + 1 <= best_n:
            continue
        n, _ = admits(bucket, after, n_le)
        if n and n + 1 > best_n:
            best, best_n = bucket, n
    return _take(rest, best, best_n)


def _admits(
    shapes: Shapes, bucket: int, room: float, pending: int, *,
    predict_ms: Callable[[int], float], max_items: int, max_tokens: int,
) -> tuple[int, bool]:  # fmt: skip
    """How many of ``pending`` requests a batch padded to ``bucket`` holds and finishes
    within ``room``, and whether that is every row such a batch may have (``False``
    when ``pending`` ran out first, or may have). Predicts no more than it must: with
    the deadline far, one prediction."""
    seq = shapes.seq_len(bucket)
    cap = min(max_items, max(max_tokens // seq, 1))
    most = min(cap, pending)
    n = _most(most, functools.partial(_fits, predict_ms, seq, room))
    return n, n < most or most == cap


def _take(rest: list[Entry[T]], bucket: int, rows: int) -> tuple[list[Entry[T]], list[Entry[T]]]:
    """The first ``rows`` requests of ``rest`` no longer than ``bucket``, and the others
    (both in ``rest``'s order)."""
    chosen: list[Entry[T]] = []
    left: list[Entry[T]] = []
    for i, e in enumerate(rest):
        if e.bucket <= bucket:
            chosen.append(e)
            if len(chosen) == rows:
                return chosen, left + rest[i + 1 :]
        else:
            left.append(e)
    return chosen, left


def _fits(predict_ms: Callable[[int], float], seq: int, room: float, rows: int) -> bool:
    return predict_ms(rows * seq) <= room


def _most(cap: int, fits: Callable[[int], bool]) -> int:
    """The largest ``r`` in ``0..cap`` with ``fits(r)``, for ``fits`` true up to a point."""
    if fits(cap):
        return cap  # the common case when the deadline is far: one prediction
    lo, hi = 0, cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
