"""pipeline.observability.sampling: device telemetry and consumer lag, one pass at a time.

The unit tests drive :func:`sample_once` with a fake consumer that keeps its
committed offsets where Faust's does (``_committed_offset``, read by
``faust_edge.committed``) and read the gauges back from the metrics' registry;
one uses a real Faust consumer, whose own code writes that private attribute.
The live test (tests/kafka/test_sampling_live.py) holds one offset of a lane back
(model fault injection) and reads the worker's ``pipeline_consumer_lag`` from its /metrics.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import faust
import pytest
from faust.transport.consumer import Consumer as FaustConsumer
from faust.types import TP

from pipeline.observability.metrics import PipelineMetrics
from pipeline.observability.sampling import DeviceReading, sample_once

LAG = "pipeline_consumer_lag"  # kafka/test_sampling_live.py names it too


def _lag(m: PipelineMetrics, topic: str, partition: int) -> float | None:
    return m.value(LAG, {"topic": topic, "partition": str(partition)})


@dataclass(frozen=True)
class _Reading:
    utilization_pct: float
    memory_used_bytes: int
    memory_total_bytes: int


class _Telemetry:
    def __init__(self, reading: DeviceReading | None = None, error: bool = False) -> None:
        self.reading = reading
        self.error = error

    def sample(self) -> DeviceReading | None:
        if self.error:
            raise RuntimeError("NVML went away")
        return self.reading


class _Consumer:
    """Faust's consumer as the sampler sees it: ``assignment()``, ``highwater(tp)``,
    and the committed offsets in Faust's private ``_committed_offset``."""

    def __init__(self, committed: Mapping[Any, int], highwaters: Mapping[Any, int | None]) -> None:
        self._committed_offset: defaultdict[Any, int | None] = defaultdict(lambda: None)
        self._committed_offset.update(committed)
        self._highwaters: dict[Any, int | None] = dict(highwaters)
        self.broken: set[Any] = set()

    def assignment(self) -> set[Any]:
        return set(self._highwaters)

    def highwater(self, tp: Any) -> int | None:
        if tp in self.broken:
            raise RuntimeError(f"no highwater for {tp}")
        return self._highwaters[tp]


def test_lag_of_every_assigned_partition_lands_in_the_metric() -> None:
    m = PipelineMetrics(process_collectors=False)
    behind, caught_up, stale = TP("lane.a", 0), TP("lane.a", 1), TP("lane.a", 2)
    never_committed, never_fetched = TP("lane.b", 0), TP("lane.b", 1)
    consumer = _Consumer(
        committed={behind: 3, caught_up: 10, stale: 12, never_fetched: 4},
        highwaters={behind: 10, caught_up: 10, stale: 11, never_committed: 5, never_fetched: None},
    )
    sample_once(m, None, consumer)
    assert _lag(m, "lane.a", 0) == 7
    assert _lag(m, "lane.a", 1) == 0
    assert _lag(m, "lane.a", 2) == 0  # a highwater behind the commit is no negative lag
    assert _lag(m, "lane.b", 0) is None  # nothing committed yet: no series
    assert _lag(m, "lane.b", 1) is None  # nothing fetched yet: no series
    # The next pass moves the gauge; a partition that lost its reading keeps the last one.
    consumer._committed_offset[behind] = 9
    consumer._highwaters[caught_up] = None
    sample_once(m, None, consumer)
    assert _lag(m, "lane.a", 0) == 1
    assert _lag(m, "lane.a", 1) == 0


def test_a_device_reading_lands_in_the_device_gauges() -> None:
    m = PipelineMetrics(process_collectors=False)
    sample_once(m, _Telemetry(None), _Consumer({}, {}))  # a CPU: nothing to read
    assert m.value("pipeline_device_memory_total_bytes") == 0
    sample_once(m, _Telemetry(_Reading(64.0, 10, 100)), _Consumer({}, {}))
    assert m.value("pipeline_device_utilisation_ratio") == pytest.approx(0.64)
    assert m.value("pipeline_device_memory_used_bytes") == 10
    assert m.value("pipeline_device_memory_total_bytes") == 100


def test_failing_readings_stop_neither_the_lag_nor_the_worker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    m = PipelineMetrics(process_collectors=False)
    broken, fine = TP("lane", 0), TP("lane", 1)
    consumer = _Consumer(committed={broken: 1, fine: 2}, highwaters={broken: 5, fine: 6})
    consumer.broken.add(broken)
    with caplog.at_level(logging.DEBUG, logger="pipeline.observability.sampling"):
        sample_once(m, _Telemetry(error=True), consumer)  # raises nothing
    assert _lag(m, "lane", 1) == 4
    assert _lag(m, "lane", 0) is None
    failures = [r for r in caplog.records if r.name == "pipeline.observability.sampling"]
    assert [r.levelno for r in failures] == [logging.DEBUG, logging.DEBUG], failures
    assert "NVML went away" in caplog.text
    assert "no highwater for" in caplog.text

    class NoAssignment:
        def assignment(self) -> set[Any]:
            raise RuntimeError("consumer not started")

    sample_once(m, _Telemetry(_Reading(50.0, 1, 2)), NoAssignment())
    assert m.value("pipeline_device_memory_used_bytes") == 1


def test_lag_from_a_real_faust_consumer_committed_offsets() -> None:
    """The contract with Faust's private ``Consumer._committed_offset``: Faust's own
    ``perform_seek`` (run on every assignment) stores the group's committed offsets
    there, and the sampler reads them (``faust_edge.check`` only looks for the
    assignment in ``Consumer.__init__``)."""
    # Faust's transport takes the thread's current loop: give it one in a policy of its
    # own, so this process's policy is left as it was, and close every loop it made.
    policy = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        app = faust.App("sampling-test", broker="kafka://127.0.0.1:9", loop=loop)
        built = app.consumer  # built, never started: nothing connects
        assert isinstance(built, FaustConsumer)
        consumer: Any = built  # its broker-facing methods are replaced below
        consumer._thread.thread_loop.close()  # its thread's loop, never started
        committed = {TP("lane", 0): 5, TP("lane", 1): 0}
        highwaters = {TP("lane", 0): 12, TP("lane", 1): 3, TP("lane", 2): 7}

        async def seek_to_committed() -> Mapping[Any, int | None]:
            return {**committed, TP("lane", 2): None}  # partition 2: the group has none

        consumer.seek_to_committed = seek_to_committed
        loop.run_until_complete(consumer.perform_seek())
    finally:
        asyncio.set_event_loop(None)
        loop.close()
        asyncio.set_event_loop_policy(policy)
    consumer.assignment = lambda: set(highwaters)
    consumer.highwater = highwaters.__getitem__
    m = PipelineMetrics(process_collectors=False)
    sample_once(m, None, consumer)
    assert _lag(m, "lane", 0) == 7
    # Faust stores a committed offset of 0 as None: a partition not read yet has no series.
    assert _lag(m, "lane", 1) is None
    assert _lag(m, "lane", 2) is None
