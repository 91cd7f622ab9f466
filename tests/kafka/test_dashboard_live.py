"""``pipeline dashboard record`` draws a real worker run (kafka, slow): the panels and
rendering are in tests/unit/observability/test_dashboard.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from support.ops import needs_prometheus

from pipeline.observability.dashboard import (
    DEFAULT_PANELS,
    load_panels,
    render,
)

# -- a real run ----------------------------------------------------------------


@pytest.mark.kafka
@pytest.mark.slow
@needs_prometheus
def test_record_draws_a_real_worker_run(kafka_bootstrap: str, tmp_path: Path) -> None:
    from pipeline.observability.dashboard.record import Scenario, record

    panels = load_panels(titles=DEFAULT_PANELS)
    scenario = Scenario(
        healthy_s=4, overload_s=4, recovery_s=4, rate=2.0, burst=12, tail_s=5, answer_timeout_s=120
    )
    run = record(kafka_bootstrap, panels, scenario, tmp_path, say=lambda _m: None)
    assert run.sent == len(scenario.workload()) and run.answered == run.sent
    assert run.model.get("device") in {"cpu", "cuda"}

    def finite(title: str) -> dict[str, int]:
        """Finite points per lane label in a panel's curves."""
        counts: dict[str, int] = {}
        for s in run.curves.series[title]:
            n = sum(1 for _, v in s.points if math.isfinite(v))
            counts[s.labels.get("lane", "")] = counts.get(s.labels.get("lane", ""), 0) + n
        return counts

    latency = finite("Request latency p50 / p95 / p99 by lane")
    assert sum(latency.values()) > 0, run.curves.series
    depth = finite("Queue depth by lane")
    assert all(depth.get(lane, 0) >= 5 for lane in ("realtime", "standard", "bulk")), depth
    names = [name for _, _, name in run.curves.phases]
    assert names == ["healthy", "overload", "recovery", "no new traffic"]
    png = render(panels, run.curves)
    assert png.startswith(b"\x89PNG")
