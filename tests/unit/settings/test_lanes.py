"""Lanes as data: one definition each, their values read once from the settings."""

from __future__ import annotations

import dataclasses

from pipeline.scheduling.degrade import Shedding
from pipeline.settings import (
    LANES,
    SchedulerSettings,
    Settings,
    TopicSettings,
    WorkerSettings,
    lanes_of,
)
from pipeline.settings.lanes import DEFINITIONS, Shed, shed_lanes


def test_lanes_carry_their_settings_highest_first() -> None:
    env = {
        "PIPELINE_TOPICS_PREFIX": "t.",
        "PIPELINE_WORKER_LANE_DEADLINE_MS_STANDARD": "1500",
        "PIPELINE_SCHEDULER_MAX_WAIT_MS_BULK": "7000",
        "PIPELINE_SCHEDULER_REALTIME_SHARE": "0.5",
        "PIPELINE_WORKER_EXPIRE_LANES": "realtime,bulk",
    }
    realtime, standard, bulk = lanes_of(Settings.from_env(env))
    assert [lane.name for lane in (realtime, standard, bulk)] == list(LANES)
    assert [lane.rank for lane in (realtime, standard, bulk)] == [0, 1, 2]
    assert bulk.topic == "t.inference.requests.bulk"
    assert (realtime.deadline_ms, standard.deadline_ms, bulk.deadline_ms) == (200, 1500, 60000)
    assert (realtime.max_wait_ms, standard.max_wait_ms, bulk.max_wait_ms) == (None, 1000, 7000)
    assert (realtime.reserved_share, standard.reserved_share) == (0.5, 0.0)
    assert (realtime.expires, standard.expires, bulk.expires) == (True, False, True)


def test_shedding_follows_each_lanes_definition() -> None:
    assert {d.name for d in DEFINITIONS if d.shed is Shed.WATCHED} == {"realtime"}
    shed = Shedding(pause=True, expire_early=True, deadline_factor=0.5)
    assert shed.paused_lanes == shed_lanes(Shed.PAUSE) == {"bulk"}
    assert [lane for lane in LANES if shed.expires(lane)] == ["standard"]
    assert shed.deadline_ms("standard", arrived_ms=0, deadline_ms=1000) == 500
    assert shed.deadline_ms("bulk", arrived_ms=0, deadline_ms=1000) == 1000


def test_every_lane_definition_has_its_settings() -> None:
    """A lane added to DEFINITIONS without its settings fails here, not at run time."""

    def names(section: type) -> set[str]:
        return {f.name for f in dataclasses.fields(section)}

    for rank, lane in enumerate(DEFINITIONS):
        assert lane.name in names(TopicSettings), lane
        assert f"lane_deadline_ms_{lane.name}" in names(WorkerSettings), lane
        assert (f"max_wait_ms_{lane.name}" in names(SchedulerSettings)) == (rank > 0), lane
