"""Properties of the scheduler on random workloads: nothing lost, caps held, EDF kept."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st
from support.scheduling import Item, drive

from pipeline.scheduling import Controller, Scheduler
from pipeline.settings import LANES, SchedulerSettings


@st.composite
def workloads(draw: st.DrawFn) -> tuple[SchedulerSettings, frozenset[str], list[Item]]:
    budget_min = draw(st.integers(16, 512))
    config = dataclasses.replace(
        SchedulerSettings(),
        max_items=draw(st.integers(1, 32)),
        token_budget_min=budget_min,
        token_budget=draw(st.integers(budget_min, 2048)),
        realtime_share=draw(st.sampled_from([0.0, 0.25, 0.5, 0.9])),
        window_ms=draw(st.integers(0, 50)),
        seq_buckets=draw(st.sampled_from(["16,32,64,128,256", "64,256", "8,16,24,32,48,64"])),
        policy=draw(st.sampled_from(["seed", "aimd"])),
    )
    expire = frozenset(draw(st.sets(st.sampled_from(LANES))))
    items = [
        Item(payload=n, lane=lane, deadline_ms=at + slack, arrived_ms=at, tokens=tokens)
        for n, (lane, at, slack, tokens) in enumerate(
            draw(
                st.lists(
                    st.tuples(
                        st.sampled_from(LANES),
                        st.integers(0, 3000),
                        st.integers(-50, 3000),
                        st.integers(1, 400),
                    ),
                    max_size=120,
                )
            )
        )
    ]
    return config, expire, items


@settings(max_examples=150, deadline=None)
@given(workloads(), st.floats(0.02, 1.0), st.sampled_from([None, 0.3, 0.9]))
def test_every_item_comes_out_once_within_caps_in_edf_order(
    workload: tuple[SchedulerSettings, frozenset[str], list[Item]],
    ms_per_token: float,
    utilisation: float | None,
) -> None:
    config, expire, items = workload
    sched: Scheduler[Item] = Scheduler(
        config, expires=expire.__contains__, controller=Controller(config, slo_ms=200)
    )
    plans = drive(
        sched, items, lambda plan: 5 + ms_per_token * plan.padded_tokens, utilisation=utilisation
    )

    out = [it.payload for _, p in plans for it in p.items + p.expired]
    assert sorted(out) == sorted(it.payload for it in items)  # exactly once
    assert len(sched) == 0
    for now, plan in plans:
        assert all(it.lane in expire for it in plan.expired)
        if not plan.items:
            assert plan.reason == "expired"
            continue
        assert len(plan.items) <= config.max_items
        assert plan.padded_tokens == len(plan.items) * plan.seq_len
        assert len(plan.items) == 1 or plan.padded_tokens <= plan.budget
        assert plan.budget <= config.token_budget_max
        assert plan.seq_len in config.buckets
        assert plan.batch_shape >= len(plan.items)
        assert all(min(it.tokens, config.buckets[-1]) <= plan.seq_len for it in plan.items)
        for lane in LANES:
            deadlines = [it.deadline_ms for it in plan.items if it.lane == lane]
            assert deadlines == sorted(deadlines)  # EDF within a lane
        for it in plan.items:
            if it.lane in expire:  # never computed when predicted to miss
                assert now + plan.predicted_ms <= it.deadline_ms + 1e-6
    budget = sched.controller.budget
    assert config.token_budget_min <= budget <= config.token_budget_max
