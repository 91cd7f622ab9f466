"""The stall watch measures real stalls: a loop blocked on purpose, a real collection."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

import pytest

from pipeline.observability.metrics import PipelineMetrics
from pipeline.observability.stalls import StallWatch


def _count(m: PipelineMetrics, name: str, labels: dict[str, str] | None = None) -> float:
    return m.value(name + "_count", labels) or 0.0


def test_a_blocked_event_loop_is_measured_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    metrics = PipelineMetrics(process_collectors=False)
    watch = StallWatch(metrics, interval_s=0.01, warn_s=0.1)

    async def scenario() -> None:
        probe = asyncio.create_task(watch.run())
        await asyncio.sleep(0.05)  # a few quiet ticks
        time.sleep(0.3)  # noqa: ASYNC251 -- the loop stands still, as under a blocking call
        await asyncio.sleep(0.05)
        probe.cancel()

    with caplog.at_level(logging.WARNING, logger="pipeline.observability.stalls"):
        asyncio.run(scenario())
    assert _count(metrics, "pipeline_event_loop_lag_seconds") >= 3
    # The stall landed in a bucket at or above 0.2 s, the quiet ticks below 0.1 s.
    le_01 = metrics.value("pipeline_event_loop_lag_seconds_bucket", {"le": "0.1"}) or 0.0
    total = _count(metrics, "pipeline_event_loop_lag_seconds")
    assert total - le_01 >= 1
    assert "event loop stalled for" in caplog.text


def test_garbage_collections_are_timed_by_generation() -> None:
    metrics = PipelineMetrics(process_collectors=False)
    watch = StallWatch(metrics)
    watch.install()
    try:
        gc.collect(2)
        gc.collect(0)
    finally:
        watch.close()
    assert _count(metrics, "pipeline_gc_pause_seconds", {"generation": "2"}) >= 1
    assert _count(metrics, "pipeline_gc_pause_seconds", {"generation": "0"}) >= 1
    before = _count(metrics, "pipeline_gc_pause_seconds", {"generation": "2"})
    gc.collect(2)  # unhooked: no longer counted
    assert _count(metrics, "pipeline_gc_pause_seconds", {"generation": "2"}) == before
    assert watch._on_gc not in gc.callbacks
