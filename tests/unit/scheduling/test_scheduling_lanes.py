"""Scheduler backpressure, metrics and settings: pause/resume hysteresis, snapshot, env."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.scheduling import Item, drive, item, scheduler

from pipeline.errors import ConfigurationError
from pipeline.scheduling.lanes import LaneQueues
from pipeline.settings import LANES, Settings

# -- backpressure -----------------------------------------------------------------------


def test_full_lanes_pause_with_hysteresis_realtime_last() -> None:
    sched = scheduler(queue_size=4, resume_fraction=0.5, flow_threshold=1.0)  # one batch
    for n in range(4):
        assert sched.offer(item(n, "bulk"))
    assert not sched.offer(item(9, "bulk")) and sched.full("bulk")
    assert sched.lanes_to_pause() == ["bulk"] and sched.lanes_to_pause() == []
    for n in range(4):
        assert sched.offer(item(10 + n, "realtime"))
    assert sched.lanes_to_pause() == ["standard", "realtime"]
    assert sched.lanes_to_resume() == []
    plan = sched.next_batch(10)  # takes realtime (all four) and bulk (all four)
    assert plan is not None and len(sched) == 0
    assert sched.lanes_to_resume() == ["realtime", "standard", "bulk"]
    snap = sched.snapshot()
    assert (snap["pauses"], snap["resumes"], snap["rejected_bulk"]) == (3, 3, 1)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["realtime", "standard", "bulk"]), st.booleans())))
def test_the_queued_count_is_every_lanes_depth_through_offers_and_removals(
    steps: list[tuple[str, bool]],
) -> None:
    """``len(queues)`` is kept as entries come and go (asked for every offer and decision),
    a full lane's refusals and removals of entries taken or given up included."""
    queues: LaneQueues[Item] = LaneQueues(LANES, queue_size=3, resume_fraction=0.5)
    for n, (lane, remove) in enumerate(steps):
        queues.offer(item(n, lane), 0)
        if remove:
            queues.remove(queues.entries(lane)[:2] + queues.entries("bulk")[-1:])
        assert len(queues) == sum(queues.depth(lane) for lane in LANES)


def test_snapshot_exposes_every_decision() -> None:
    sched = scheduler()
    drive(sched, [item(n, "standard", tokens=20 + n % 50, at=n) for n in range(100)])
    snap = sched.snapshot()
    for key in (
        "batch_size_last",
        "batch_tokens_last",
        "padding_ratio",
        "padding_ratio_last",
        "wait_ms_mean_standard",
        "wait_ms_max_bulk",
        "budget",
        "budget_grows",
        "budget_shrinks",
        "expired_realtime",
        "pauses",
        "dispatch_window",
        "depth_bulk",
    ):
        assert key in snap, key
    assert snap["items"] == 100 and snap["pending"] == 0


def test_scheduler_settings_from_env() -> None:
    s = Settings.from_env(
        {"PIPELINE_SCHEDULER_POLICY": "aimd", "PIPELINE_SCHEDULER_SEQ_BUCKETS": "32,128"}
    )
    assert s.scheduler.policy == "aimd" and s.scheduler.buckets == (32, 128)
    assert s.scheduler.max_wait_ms("bulk") == 5000 and s.scheduler.max_wait_ms("realtime") is None
    with pytest.raises(ConfigurationError, match="policy"):
        Settings.from_env({"PIPELINE_SCHEDULER_POLICY": "pid"})
    with pytest.raises(ConfigurationError, match="seq_buckets"):
        Settings.from_env({"PIPELINE_SCHEDULER_SEQ_BUCKETS": "64,32"})
