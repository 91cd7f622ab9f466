"""Realtime beyond capacity, on a fake clock: as many deadlines met as the model allows,
the rest expired at once, never after their deadline (issue 31)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st
from support.scheduling import Item, cpu_ms, drive, item, scheduler

from pipeline.scheduling import Plan
from pipeline.scheduling.budget import Shapes
from pipeline.scheduling.lanes import Entry
from pipeline.scheduling.triage import Triage, triage

#: Every text is one 8-token bucket: a batch of r rows costs overhead + 8 x cost x r.
BUCKETS = "8,16,32"


def _most_on_time(n: int, deadline: int, *, overhead: float, per_row: float, rows: int) -> int:
    """The most of ``n`` equal requests, all there at 0, that one engine finishes by
    ``deadline`` in batches of at most ``rows``: the fewer batches the better, so
    the largest r with ceil(r / rows) x overhead + r x per_row <= deadline."""
    return max(
        (r for r in range(n + 1) if math.ceil(r / rows) * overhead + r * per_row <= deadline),
        default=0,
    )


@settings(max_examples=120, deadline=None)
@given(
    rows=st.integers(1, 32),
    overhead=st.integers(1, 30),
    cost=st.sampled_from([0.25, 0.5, 1.0, 2.0]),
    deadline=st.integers(1, 400),
    data=st.data(),
)
def test_exactly_as_many_as_can_finish_are_planned_on_time_the_rest_expire_at_once(
    rows: int, overhead: int, cost: float, deadline: int, data: st.DataObject
) -> None:
    n = data.draw(st.integers(1, 4 * rows))  # all of them in the scheduler's view
    # Integer costs, and a latency model that keeps the newest batch alone (alpha 1):
    # it stays exact, so no rounding tips a comparison on a deadline.
    fixed = float(overhead)
    sched = scheduler(
        seq_buckets=BUCKETS, max_items=rows, token_budget=8 * rows, token_budget_min=8,
        policy="fixed", window_ms=0, margin_ms=0, latency_overhead_ms=fixed,
        latency_ms_per_token=cost, latency_alpha=1.0,
    )  # fmt: skip
    burst = [item(k, "realtime", tokens=8, at=0, deadline=deadline) for k in range(n)]

    def engine(plan: Plan[Item]) -> float:
        return fixed + cost * plan.padded_tokens

    run = drive(sched, burst, engine)

    k = _most_on_time(n, deadline, overhead=fixed, per_row=8 * cost, rows=rows)
    on_time = [
        it for now, p in run for it in p.items if now + math.ceil(engine(p)) <= it.deadline_ms
    ]
    late = [it for now, p in run for it in p.items if now + math.ceil(engine(p)) > it.deadline_ms]
    expired = [(now, it) for now, p in run for it in p.expired]
    assert len(on_time) == min(n, k) and not late
    assert len(expired) == n - len(on_time)
    assert all(now == 0 for now, _ in expired)  # at once, long before the deadline


def test_a_burst_that_fits_one_batch_at_the_best_rate_runs_in_it() -> None:
    # The case, on its numbers: short realtime texts all made at once, 176 ms
    # left of the 200 ms deadline, ~45 ms for a batch of 8 (the flow cap's size), and
    # 30 of them take ~130 ms in one batch. Batches of the capped size finished four
    # batches' worth and expired the rest at their deadline.
    burst = [item(k, "realtime", tokens=10, at=0, deadline=176) for k in range(30)]

    def cpu(plan: Plan[Item]) -> float:
        return 12 + 0.33 * plan.padded_tokens

    sched = scheduler(latency_ms_per_token=0.33)
    run = drive(sched, burst, cpu)
    assert [len(p.items) for _, p in run] == [30]
    now, plan = run[0]
    assert not plan.expired and now + cpu(plan) <= 176


def test_what_cannot_make_it_is_expired_before_its_deadline_the_rest_run() -> None:
    # 60 short realtime requests with 120 ms left: one batch of 32 rows (the CPU's
    # max_items, 16-token bucket) takes 12 + 0.2 x 512 = 114.4 ms; a second batch could
    # not start before then and would end past 120: 28 expire at once, not at 120 ms.
    burst = [item(k, "realtime", tokens=6, at=0, deadline=120) for k in range(60)]
    sched = scheduler(max_items=32)
    run = drive(sched, burst)
    expired = [(now, it) for now, p in run for it in p.expired]
    ran = [it for _, p in run for it in p.items]
    assert len(ran) == 32 and len(expired) == 28
    assert {now for now, _ in expired} == {0}


def test_a_batch_planned_while_the_engine_is_busy_counts_from_its_end() -> None:
    # The engine holds batches until 150 ms: a request due at 160 cannot finish (a batch
    # of one takes 12 + 0.2 x 16 ms from 150), one due at 190 can, and is planned to.
    sched = scheduler()
    sched.offer(item(1, "realtime", at=100, deadline=160))
    sched.offer(item(2, "realtime", at=100, deadline=190))
    assert sched.wait_ms(100, engine_free_ms=150.0) == 0
    plan = sched.next_batch(100, engine_free_ms=150.0)
    assert plan is not None
    assert [it.payload for it in plan.expired] == [1]
    assert [it.payload for it in plan.items] == [2]
    assert 150 + plan.predicted_ms <= 190
    # An idle engine (no engine_free_ms) runs both.
    idle = scheduler()
    idle.offer(item(1, "realtime", at=100, deadline=160))
    idle.offer(item(2, "realtime", at=100, deadline=190))
    plan = idle.next_batch(110)
    assert plan is not None and not plan.expired and len(plan.items) == 2


def test_aged_requests_keep_their_bound_beside_a_realtime_burst() -> None:
    # Standard requests about to age (1 s) when a realtime burst larger than capacity
    # arrives: the large realtime batch is not planned across the moment they age.
    standard = [item(k, "standard", at=0, tokens=20) for k in range(6)]
    burst = [item(100 + k, "realtime", tokens=6, at=900) for k in range(80)]
    sched = scheduler()
    run = drive(sched, standard + burst)
    waits = [now - it.arrived_ms for now, p in run for it in p.items if it.lane == "standard"]
    assert len(waits) == 6 and max(waits) <= 1000


def test_the_layout_finishes_short_texts_first_when_a_long_one_would_pad_them() -> None:
    # Ten 8-token texts and one 200-token text, all due at 60 ms: padded to 256, the
    # batch could not hold more than one; capped at 8 tokens it holds the ten.
    sched = scheduler(seq_buckets="8,256")
    for k, tokens in enumerate([8] * 3 + [200] + [8] * 7):
        it = Item(payload=k, lane="realtime", deadline_ms=60, arrived_ms=0, tokens=tokens)
        assert sched.offer(it)
    entries = sched.queues.entries("realtime")
    lay = triage(
        entries, sched.shapes, start_ms=0, predict_ms=sched.controller.predict_ms,
        max_items=32, max_tokens=4096, margin_ms=5,
    )  # fmt: skip
    assert [len(b) for b in lay.batches] == [10]
    assert [e.item.tokens for e in lay.hopeless] == [200]


def test_with_triage_off_the_capped_batches_run_and_expire_at_the_deadline() -> None:
    # The burst above, the rule switched off (PIPELINE_SCHEDULER_TRIAGE=false): the
    # flow cap's small batches, and no request expired before a batch would miss it.
    burst = [item(k, "realtime", tokens=10, at=0, deadline=176) for k in range(30)]

    def cpu(plan: Plan[Item]) -> float:
        return 12 + 0.33 * plan.padded_tokens

    run = drive(scheduler(latency_ms_per_token=0.33, triage="off"), burst, cpu)
    assert len([p for _, p in run if p.items]) > 1
    assert max(len(p.items) for _, p in run) < 30


def test_a_long_first_text_does_not_pad_the_short_ones_of_its_burst() -> None:
    # A burst made at about the same moment: its earliest deadline is a long text's,
    # by a millisecond. Anchored at it, every batch padded the short texts to its
    # length (3 rows of 128 tokens in the room of 20 short ones); the short ones
    # run first in a batch of their own, the long one alone right after, in time.
    shapes = Shapes((16, 128), 32)
    long_ = Entry(100, 0, item(0, "realtime", tokens=120, deadline=100), 1)
    short = [Entry(101, k, item(k, "realtime", tokens=12, deadline=101), 0) for k in range(1, 18)]
    out = triage([long_, *short], shapes, start_ms=0, predict_ms=_cost, max_items=32,
                 max_tokens=4096, margin_ms=0)  # fmt: skip
    first, second = out.batches[0], out.batches[1]
    # 17 short (10 + 0.2 x 16 x 17 = 64.4 ms), then the long one alone (35.6 ms): 100.
    assert all(e is not long_ for e in first) and len(first) == 17
    assert second == [long_]
    assert out.on_time == 18 and not out.hopeless
    # Anchored at the long text: 3 rows of 128 (86.8 ms), then 1 short: 4 on time.


def test_beyond_capacity_a_long_text_gives_way_to_the_short_ones_it_would_cost() -> None:
    # The same burst with 29 short texts: earliest deadlines first (the long one, then
    # the short ones after it) finishes 18; the long one's 35.6 ms alone are the time
    # of 11 short rows. Given up, the short ones run in one batch: 28 on time
    # (10 + 0.2 x 16 x 28 = 99.6 ms); the long one and the 29th expire now. (The
    # burst of 1,000 on the bench: a 102-token text ran alone while short ones expired.)
    shapes = Shapes((16, 128), 32)
    long_ = Entry(100, 0, item(0, "realtime", tokens=120, deadline=100), 1)
    short = [Entry(101, k, item(k, "realtime", tokens=12, deadline=101), 0) for k in range(1, 30)]
    lay = functools.partial(triage, [long_, *short], shapes, start_ms=0, predict_ms=_cost,
                            max_items=32, max_tokens=4096, margin_ms=0)  # fmt: skip
    assert earliest_first_on_time(lay) == 18
    out = lay()
    assert [len(b) for b in out.batches] == [28]
    assert out.on_time == 28
    assert long_ in out.hopeless and len(out.hopeless) == 2


def earliest_first_on_time(lay: Callable[..., Triage[Item]]) -> int:
    return lay(give_way=False).on_time


def _cost(tokens: int) -> float:
    return 10 + 0.2 * tokens


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.sampled_from([4, 8, 12, 16, 30, 60, 120]), min_size=1, max_size=40),
    deadlines=st.lists(st.integers(20, 300), min_size=40, max_size=40),
    max_items=st.integers(1, 32),
)
def test_giving_way_never_finishes_fewer_and_every_batch_ends_in_time(
    lengths: list[int], deadlines: list[int], max_items: int
) -> None:
    # The length rule may only win: the layout it picks finishes at least as many as
    # earliest deadlines first, every batch it lays out ends (as predicted) by each of
    # its requests' deadlines, and every request is laid out, hopeless or past the
    # layout's reach exactly once.
    shapes = Shapes((8, 16, 32, 64, 128), max_items)
    entries = sorted(
        (Entry(d, k, item(k, "realtime", tokens=t, deadline=d), shapes.seq_index(t))
         for k, (t, d) in enumerate(zip(lengths, deadlines, strict=False))),
        key=lambda e: (e.deadline_ms, e.seq),
    )  # fmt: skip
    lay = functools.partial(triage, entries, shapes, start_ms=0, predict_ms=_cost,
                            max_items=max_items, max_tokens=4096, margin_ms=2)  # fmt: skip
    out = lay()
    assert out.on_time >= earliest_first_on_time(lay)
    for start, padded, batch in zip(out.starts, out.padded, out.batches, strict=True):
        end = start + _cost(padded)
        assert all(end <= e.deadline_ms for e in batch)
    seen = [id(e) for b in out.batches for e in b] + [id(e) for e in out.hopeless + out.rest]
    assert sorted(seen) == sorted(id(e) for e in entries)


def test_the_batch_that_runs_is_the_layouts_first_not_the_heads_pick() -> None:
    # A 50-token text with the earliest deadline (60 ms) and 20 short ones due just
    # after it. The layout finishes the 20 short ones in one batch (12 + 0.2 x 8 x 20 =
    # 44 ms) and gives the long one up; the batch that runs is that one. Assembled from
    # the head in deadline order instead, the long text and one short one ran first
    # (2 rows of 64 tokens, 37.6 ms), and 6 of the 21 finished in time.
    burst = [item(0, "realtime", tokens=50, at=0, deadline=60)] + [
        item(k, "realtime", tokens=6, at=0, deadline=60 + k) for k in range(1, 21)
    ]
    run = drive(scheduler(seq_buckets="8,16,32,64"), burst)
    on_time = [it for now, p in run for it in p.items if now + cpu_ms(p) <= it.deadline_ms]
    late = [it for now, p in run for it in p.items if now + cpu_ms(p) > it.deadline_ms]
    expired = [(now, it.payload) for now, p in run for it in p.expired]
    assert len(on_time) == 20 and not late
    assert expired == [(0, 0)]


def test_the_overrun_sizes_the_layout_but_rejects_nothing_the_model_finishes() -> None:
    # A burst of 300's realtime queue as a worker logged it when it rejected the burst's
    # longest text (seven short texts, two of 80 tokens; 112-114 ms left; the fitted
    # model 12.34 ms + 0.1215 ms a token; an overrun of 1.4). Planned at 1.4x, the seven
    # run first (74 ms), one long text alone (to 105 ms), and the other has no chance
    # from there; by the model's own prediction both long texts end by 97 ms, so neither
    # is rejected: the caution sizes the batches, it does not reject.
    sched = scheduler(seq_buckets="2,4,8,16,24,28,48,80,128,256")
    sched.controller.model.overhead_ms, sched.controller.model.ms_per_token = 12.34, 0.1215
    sched.realtime.overrun = 1.4
    shapes = sched.shapes
    queue = [(112, 80), (112, 28), (112, 48), (113, 24), (114, 48), (114, 6), (114, 48),
             (114, 8), (114, 80)]  # fmt: skip
    entries = [
        Entry(dl, n, item(n, "realtime", tokens=tokens, deadline=dl), shapes.seq_index(tokens))
        for n, (dl, tokens) in enumerate(queue)
    ]
    doomed, _budget, first, layout = sched.realtime.triage(entries, 0.0, 512, aged_ms=math.inf)
    assert doomed == [] and layout is not None
    assert sum(len(b) for b in layout.batches) == len(queue)  # every one laid out
    assert first is not None and all(e.item.tokens < 80 for e in first)  # short ones first
