"""Realtime planned on what the engine measured, on a fake clock (issue 31).

Two rules: realtime's batches are planned on the latency model's prediction
times the overrun the last batches measured (batches that ran k times their
prediction make the plan allow k times), and the first batches after the
scheduler woke from empty stay within the flow bound, since a burst's realtime
may arrive right behind its first requests.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from support.scheduling import SLO_MS, Item, drive, item, scheduler

from pipeline.scheduling import Plan, Scheduler
from pipeline.scheduling.controller import LatencyModel
from pipeline.scheduling.realtime import MAX_OVERRUN, OVERRUN_BATCHES

#: Every text is one 8-token bucket: a batch of r rows costs overhead + 8 x cost x r.
BUCKETS = "8,16,32"


class _Frozen(LatencyModel):
    """A latency model that never learns: its predictions stay the settings' own, so
    only the scheduler's overrun can see the engine run slower than predicted."""

    def observe(self, padded_tokens: int, latency_ms: float) -> None:
        del padded_tokens, latency_ms


def _ran_slow(sched: Scheduler[Item], k: float, batches: int = OVERRUN_BATCHES) -> None:
    """Feed ``batches`` finished batches that ran ``k`` times their prediction."""
    for n in range(batches):
        predicted = sched.controller.predict_ms(8)
        plan: Plan[Item] = Plan(
            items=[item(-1 - n, "standard", tokens=8)], expired=[], seq_len=8, batch_shape=1,
            real_tokens=8, padded_tokens=8, budget=8, reason="full", predicted_ms=predicted,
        )  # fmt: skip
        sched.observe(plan, latency_ms=k * predicted, utilisation=None, now_ms=0)


def _most_on_time(n: int, deadline: int, *, overhead: float, per_row: float, rows: int) -> int:
    """The most of ``n`` equal requests, all there at 0, that one engine finishes by
    ``deadline`` in batches of at most ``rows`` (the fewer batches the better)."""
    return max(
        (r for r in range(n + 1) if math.ceil(r / rows) * overhead + r * per_row <= deadline),
        default=0,
    )


#: A burst's shape: rows a batch holds, the model's fixed cost and cost per token, the
#: realtime deadline (the burst's size is drawn from ``data``, up to 4 batches).
_BURSTS = {
    "rows": st.integers(1, 32),
    "overhead": st.integers(1, 30),
    "cost": st.sampled_from([0.25, 0.5, 1.0, 2.0]),
    "deadline": st.integers(1, 400),
    "data": st.data(),
}


def _slowed(k: float, rows: int, fixed: float, cost: float, **extra: Any) -> Scheduler[Item]:
    """A scheduler of ``rows``-row batches whose latency model predicts ``fixed`` +
    ``cost`` a token and never learns, after batches that ran ``k`` times that."""
    sched = scheduler(
        seq_buckets=BUCKETS, max_items=rows, token_budget=8 * rows, token_budget_min=8,
        policy="fixed", window_ms=0, margin_ms=0, latency_overhead_ms=fixed,
        latency_ms_per_token=cost, **extra,
    )  # fmt: skip
    sched.controller.model = _Frozen(overhead_ms=fixed, ms_per_token=cost, alpha=1.0)
    _ran_slow(sched, k)
    return sched


@settings(max_examples=120, deadline=None)
@given(k=st.sampled_from([1, 2, 3]), **_BURSTS)
def test_realtime_planned_on_the_measured_overrun_meets_its_deadlines(
    *, k: int, rows: int, overhead: int, cost: float, deadline: int, data: st.DataObject
) -> None:
    # The engine runs every batch k times the latency model's prediction, and did so
    # for the last batches: of a realtime burst exactly as many as such an engine can
    # finish in time are computed in time; the rest expire once the model's own
    # prediction gives them no chance (the caution sizes batches, it never rejects),
    # and those it still gives one run alone, after the others.
    n = data.draw(st.integers(1, 4 * rows))
    fixed = float(overhead)
    sched = _slowed(k, rows, fixed, cost)
    assert sched.overrun == k
    burst = [item(k_, "realtime", tokens=8, at=0, deadline=deadline) for k_ in range(n)]

    def engine(plan: Plan[Item]) -> float:
        return k * (fixed + cost * plan.padded_tokens)

    run = drive(sched, burst, engine)

    best = _most_on_time(n, deadline, overhead=k * fixed, per_row=k * 8 * cost, rows=rows)
    on_time = [it for now, p in run for it in p.items if now + engine(p) <= it.deadline_ms]
    assert len(on_time) == min(n, best)
    late = [(now, p) for now, p in run if p.items and now + engine(p) > p.items[0].deadline_ms]
    for now, p in late:  # a chance the model's own prediction gave, taken alone
        assert len(p.items) == 1 and now + fixed + cost * p.padded_tokens <= deadline
    assert [now for now, p in late] == sorted(now for now, p in late)
    last_in_time = max((t for t, q in run if set(q.items) & set(on_time)), default=-1)
    assert all(now > last_in_time for now, _ in late)  # after the others
    expired = [(now, it) for now, p in run for it in p.expired]
    assert len(expired) + len(on_time) + len(late) == n
    left = n  # queued when each decision is made
    for now, p in run:
        # Never more rejected than the model's own prediction must: from now, one by
        # one (the slowest way), at least this many of those queued would still finish.
        finish = max(0, int((deadline - now) // (fixed + 8 * cost)))
        assert left - len(p.expired) >= min(left, finish)
        left -= len(p.items) + len(p.expired)


@given(k=st.floats(0.1, 10.0), batches=st.integers(1, 2 * OVERRUN_BATCHES))
def test_the_overrun_is_what_the_last_batches_measured_within_its_bounds(
    k: float, batches: int
) -> None:
    sched = scheduler()
    sched.controller.model = _Frozen(overhead_ms=12.0, ms_per_token=0.2, alpha=1.0)
    assert sched.overrun == 1.0  # nothing measured yet: the model as it predicts
    _ran_slow(sched, 2.0, OVERRUN_BATCHES)
    _ran_slow(sched, k, batches)
    # The last OVERRUN_BATCHES batches count, each with its own prediction, and the
    # newest alone when it ran slower (a burst's contention shows there first).
    newest = min(batches, OVERRUN_BATCHES)
    ran = (newest * k + (OVERRUN_BATCHES - newest) * 2.0) / OVERRUN_BATCHES
    assert math.isclose(sched.overrun, min(max(ran, k, 1.0), MAX_OVERRUN))


@settings(max_examples=100, deadline=None)
@given(
    lanes=st.lists(st.sampled_from(["standard", "bulk"]), min_size=1, max_size=200),
    tokens=st.integers(1, 60),
    asleep_ms=st.integers(0, 5000),
    after_ms=st.integers(10, SLO_MS),  # from the window (10 ms) on, a batch is due
)
def test_the_first_batches_after_the_scheduler_woke_stay_within_the_flow_bound(
    lanes: list[str], tokens: int, asleep_ms: int, after_ms: int
) -> None:
    # A burst of standard and bulk reaches an idle scheduler (no realtime flowing: the
    # last realtime request was long ago); its realtime may be right behind. Batches
    # formed within a realtime deadline of the first arrival stay within the flow
    # bound (0.2 x 200 ms), not the latency threshold (100 ms), so realtime that
    # arrives meanwhile waits for a short batch.
    sched = scheduler()
    sched.offer(item(0, "realtime", at=0))
    assert sched.next_batch(sched.settings.window_ms) is not None  # realtime once, then silence
    at = 1 + asleep_ms + 1000
    burst: list[Item] = [item(n + 1, lane, tokens=tokens, at=at) for n, lane in enumerate(lanes)]
    for it in burst:
        assert sched.offer(it)
    now = at + max(after_ms, sched.settings.wake_hold_ms)  # a full batch waits out the hold
    plan = sched.next_batch(now)
    assert plan is not None and plan.items
    c = sched.controller
    cap = max(
        c.tokens_within(sched.settings.flow_threshold * SLO_MS), sched.settings.token_budget_min
    )
    assert len(plan.items) == 1 or plan.padded_tokens <= cap
    # Past that deadline, with no realtime seen, the latency threshold bounds them again.
    later = sched.next_batch(at + SLO_MS + 1)
    if later is not None and len(later.items) > 1:
        assert later.padded_tokens <= max(c.tokens_within(c.threshold_ms), c.budget)


@settings(max_examples=200, deadline=None)
@given(k=st.sampled_from([1.5, 2, 3]), **_BURSTS)
def test_an_overrun_the_engine_does_not_repeat_rejects_nothing_the_model_finishes(
    *, k: float, rows: int, overhead: int, cost: float, deadline: int, data: st.DataObject
) -> None:
    # The last batches ran k times their prediction (a burst's first batches after a
    # silence, on shared cores), and the engine now runs as the model predicts: the
    # overrun sizes realtime's batches, but every request the model's own prediction
    # finishes in time is run, none expired (a burst of 300's longest text was
    # rejected with 114 ms left where the model finished it by 97 ms).
    n = data.draw(st.integers(1, 4 * rows))
    fixed = float(overhead)
    sched = _slowed(k, rows, fixed, cost, wake_hold_ms=0)  # the burst runs from 0
    burst = [item(k_, "realtime", tokens=8, at=0, deadline=deadline) for k_ in range(n)]

    def engine(plan: Plan[Item]) -> float:
        return fixed + cost * plan.padded_tokens

    run = drive(sched, burst, engine)
    on_time = [it for now, p in run for it in p.items if now + engine(p) <= it.deadline_ms]
    cautious = _most_on_time(n, deadline, overhead=k * fixed, per_row=k * 8 * cost, rows=rows)
    alone = _most_on_time(n, deadline, overhead=fixed, per_row=8 * cost, rows=1)
    assert len(on_time) >= min(n, cautious)  # at least what the caution planned
    assert len(on_time) >= min(n, alone)  # and every one the model finishes one by one
