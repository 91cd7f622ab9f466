"""pipeline.sampling: device telemetry and consumer lag, one pass at a time.

The unit tests drive :func:`sample_once` with a fake consumer that keeps its
committed offsets where Faust's does (``_committed_offset``, read by
``faust_edge.committed``) and read the gauges back from the metrics' registry;
one uses a real Faust consumer, whose own code writes that private attribute.
The live test holds one offset of a lane back (model fault injection) and
reads the worker's ``pipeline_consumer_lag`` from its /metrics.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import urllib.request
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faust
import pytest
from faust.transport.consumer import Consumer as FaustConsumer
from faust.types import TP
from harness import Deployment
from prometheus_client.parser import text_string_to_metric_families

from pipeline.client import RequestProducer
from pipeline.metrics import PipelineMetrics
from pipeline.sampling import DeviceReading, sample_once
from pipeline.supervise import free_port

LAG = "pipeline_consumer_lag"


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
    with caplog.at_level(logging.DEBUG, logger="pipeline.sampling"):
        sample_once(m, _Telemetry(error=True), consumer)  # raises nothing
    assert _lag(m, "lane", 1) == 4
    assert _lag(m, "lane", 0) is None
    failures = [r for r in caplog.records if r.name == "pipeline.sampling"]
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


# -- a real worker -------------------------------------------------------------


def _scrape_lag(port: int, topic: str) -> dict[int, float]:
    """The worker's ``pipeline_consumer_lag`` of ``topic``'s partitions, from /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        int(s.labels["partition"]): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == LAG and s.labels["topic"] == topic
    }


@pytest.mark.kafka
@pytest.mark.slow
def test_worker_reports_the_lag_behind_an_offset_it_cannot_commit_past(
    kafka_bootstrap: str, tmp_path: Path, tiny_dir: Path
) -> None:
    """Offset 1 of a one-partition lane fails in the model and is retried for as long
    as the test runs, so the group's commit stops at 1 while the partition's end is
    ``total``: the worker must report a lag of exactly ``total - 1``."""
    dep = Deployment.create(
        kafka_bootstrap,
        tmp_path,
        partitions=1,
        PIPELINE_MODEL_PATH=str(tiny_dir),
        PIPELINE_MODEL_TORCH_THREADS="1",
        PIPELINE_MODEL_FAIL_ON="held back",
        PIPELINE_RETRY_MAX_ATTEMPTS="1000",
        PIPELINE_RETRY_BACKOFF_BASE_MS="1000",
        PIPELINE_RETRY_BACKOFF_MAX_MS="1000",
        PIPELINE_DEGRADE_ENABLED="false",
        PIPELINE_METRICS_SAMPLE_INTERVAL_S="0.2",
    )
    port = free_port()
    total, held_at = 6, 1
    # Not dep.worker(): a clean stop waits for every input to be answered, and the
    # held one never is, so the worker is killed when the test is done with it.
    worker = dep.spawn(PIPELINE_METRICS_PORT=str(port))
    try:
        worker.wait_ready()
        _hold_an_offset_and_read_the_lag(dep, port, total, held_at)
    finally:
        worker.signal(signal.SIGKILL)
        worker.proc.wait(30)


def _hold_an_offset_and_read_the_lag(dep: Deployment, port: int, total: int, held_at: int) -> None:
    lane = dep.settings.topics.lane_topic("bulk")
    with RequestProducer(dep.settings) as producer:
        for i in range(total):
            text = "this request is held back" if i == held_at else f"request {i} is a good film"
            producer.send(text, lane="bulk", request_id=f"r-{i}")
        producer.flush()
        answers = dep.answers(expect=total - 1)
        assert f"r-{held_at}" not in {a.record["request_id"] for a in answers}
        # The commit reaches the held offset within a commit interval (Faust's 2.8 s)
        # and stays there; the sampler reads it every 0.2 s.
        deadline = time.monotonic() + 30
        while (lag := _scrape_lag(port, lane)) != {0: total - held_at}:
            assert time.monotonic() < deadline, f"lag never read {total - held_at}: {lag}"
            time.sleep(0.2)
