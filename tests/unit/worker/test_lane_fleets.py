"""PIPELINE_WORKER_LANES: a worker consumes the lanes it names, and only those."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline.errors import ConfigurationError
from pipeline.settings import Settings
from pipeline.worker.admission import LaneBounds
from pipeline.worker.lane_buffer import LaneBuffer


def test_lanes_default_to_all_three_and_are_named_highest_first() -> None:
    assert Settings.from_env({}).worker.consumed_lanes() == ("realtime", "standard", "bulk")
    worker = Settings.from_env({"PIPELINE_WORKER_LANES": "bulk, standard"}).worker
    assert worker.consumed_lanes() == ("standard", "bulk")


@pytest.mark.parametrize("value", ["", "urgent", "realtime,realtime", "realtime,,bulkk"])
def test_a_lane_list_that_names_no_lane_or_a_lane_twice_is_refused(value: str) -> None:
    with pytest.raises(ConfigurationError, match="PIPELINE_WORKER_LANES"):
        Settings.from_env({"PIPELINE_WORKER_LANES": value})


def test_a_realtime_only_buffer_holds_nothing_of_the_lanes_it_does_not_consume() -> None:
    # The reader asks the buffer for every lane, highest first; a realtime fleet's
    # buffer knows only realtime's topic.
    buffer = LaneBuffer(
        {"lane.realtime": "realtime"}, LaneBounds(10, 10**6), pause=print, resume=print
    )
    buffer.put([SimpleNamespace(topic="lane.realtime", tp=("lane.realtime", 0), value=b"x",
                                key=None)])  # fmt: skip
    assert buffer.pending("realtime") == 1 and buffer.pending() == 1
    assert buffer.pending("bulk") == 0
