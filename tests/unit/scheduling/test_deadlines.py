"""Deadlines: lane budgets, expiring lanes, and shedding's changes through one owner."""

from __future__ import annotations

from pipeline.scheduling.deadlines import Deadlines
from pipeline.scheduling.degrade import Shedding
from pipeline.settings import Settings, lanes_of


def _deadlines(**env: str) -> Deadlines:
    return Deadlines(lanes_of(Settings.from_env({f"PIPELINE_{k}": v for k, v in env.items()})))


def test_lane_budgets_and_expiring_lanes_come_from_the_settings() -> None:
    d = _deadlines(
        WORKER_LANE_DEADLINE_MS_REALTIME="150",
        WORKER_LANE_DEADLINE_MS_BULK="9000",
        WORKER_EXPIRE_LANES="realtime,bulk",
    )
    assert (d.lane_ms("realtime"), d.lane_ms("bulk")) == (150, 9000)
    assert [d.expires(lane) for lane in ("realtime", "standard", "bulk")] == [True, False, True]


def test_shedding_changes_deadlines_and_expiry_only_through_shed_and_back() -> None:
    d = _deadlines(WORKER_EXPIRE_LANES="realtime")
    arrived, due = 1_000, 3_000
    assert d.schedule_by("standard", arrived_ms=arrived, deadline_ms=due) == due
    assert not d.expires("standard")
    d.shed(Shedding(expire_early=True, deadline_factor=0.5))
    assert d.schedule_by("standard", arrived_ms=arrived, deadline_ms=due) == 2_000  # half
    assert d.schedule_by("realtime", arrived_ms=arrived, deadline_ms=due) == due  # watched
    assert d.expires("standard") and d.expires("realtime") and not d.expires("bulk")
    d.shed(Shedding())  # recovered
    assert d.schedule_by("standard", arrived_ms=arrived, deadline_ms=due) == due
    assert not d.expires("standard") and d.expires("realtime")
