"""Shared by the metrics, ops and dashboard tests: a fully populated metrics facade,
and the markers of tests that need promtool or a real Prometheus."""

from __future__ import annotations

import shutil

import pytest

from pipeline.observability.metrics import PipelineMetrics

__all__ = ["PROMETHEUS", "PROMTOOL", "needs_prometheus", "needs_promtool", "populated"]

PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
# Skipped off CI when missing, failed on CI (support.require).
needs_promtool = pytest.mark.requires(
    PROMTOOL is not None,
    "promtool on PATH (apt-get install prometheus; ./run setup installs it when root)",
)
needs_prometheus = pytest.mark.requires(
    PROMETHEUS is not None,
    "prometheus on PATH (apt-get install prometheus; ./run setup installs it when root)",
)


def populated() -> PipelineMetrics:
    """A facade with every method called at least once."""
    m = PipelineMetrics()
    m.arrived("realtime")
    m.arrived("realtime")
    m.arrived("bulk")
    m.completed("realtime", "computed", 0.12)
    m.completed("realtime", "stored", 0.35, late=True)
    m.completed("bulk", "batch", 2.5)
    m.dead_letter("decode", "standard")
    m.dead_letter("expired", "realtime")
    m.expired("bulk")
    m.deadline_missed("standard")
    m.completed("bulk", "inflight")
    m.wait("realtime", 0.004)
    m.batch(size=8, real_tokens=150, padded_tokens=256, latency_s=0.031, reason="full")
    m.queue_depth("bulk", 17)
    m.inflight(25)
    m.budget(512)
    m.budget_change("shrink")
    m.paused("bulk", True)
    m.device(0.42, 3 * 2**30, 80 * 2**30)
    m.busy_fraction(0.9)
    m.consumer_lag("inference.requests.bulk", 2, 1234)
    m.breaker_state("open")
    m.model("all-MiniLM-L6-v2", "1", "cpu", "embed")
    return m
