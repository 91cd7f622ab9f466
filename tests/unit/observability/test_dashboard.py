"""pipeline.observability.dashboard: panels read from the dashboard JSON, curves drawn as a PNG, the
CLI's errors. A real worker run drawn through a real Prometheus (kafka + slow) is in
tests/kafka/test_dashboard_live.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.errors import ConfigurationError
from pipeline.observability.dashboard import (
    DEFAULT_PANELS,
    Curves,
    Panel,
    Series,
    Target,
    dump,
    figure,
    load,
    load_panels,
    promql,
    render,
)
from pipeline.observability.dashboard.panels import grafana_rate_interval, legend
from pipeline.tools.supervise import free_port

T0 = 1_700_000_000.0


def _points(values: list[float]) -> list[tuple[float, float]]:
    return [(T0 + i, v) for i, v in enumerate(values)]


LATENCY = Panel(
    1,
    "Latency by lane",
    "s",
    (Target("A", "p50_expr", "p50 {{lane}}"), Target("B", "p99_expr", "p99 {{lane}}")),
)
DEPTH = Panel(2, "Queue depth", "short", (Target("A", "depth_expr", "{{lane}}"),))
BUSY = Panel(3, "Busy", "percentunit", (Target("A", "busy_expr", ""),), min=0, max=1)
EMPTY = Panel(4, "Nothing here", "reqps", (Target("A", "nothing", "{{stage}}"),))
NAN_ONLY = Panel(5, "Only NaN", "s", (Target("A", "nan", "p95"),))
PANELS = [LATENCY, DEPTH, BUSY, EMPTY, NAN_ONLY]


def _curves() -> Curves:
    nan = math.nan
    return Curves(
        start=T0,
        end=T0 + 9,
        step_s=1,
        rate_interval="4s",
        series={
            LATENCY.title: [
                Series(0, "p50 realtime", {"lane": "realtime"}, _points([0.05] * 10)),
                Series(1, "p99 realtime", {"lane": "realtime"}, _points([0.15, nan] + [0.2] * 8)),
                Series(1, "p99 bulk", {"lane": "bulk"}, _points([2.0] * 10)),
            ],
            DEPTH.title: [
                Series(0, lane, {"lane": lane}, _points([float(i) for i in range(10)]))
                for lane in ("realtime", "standard", "bulk")
            ],
            BUSY.title: [Series(0, "value", {}, _points([0.3, 0.7] * 5))],
            EMPTY.title: [],
            NAN_ONLY.title: [Series(0, "p95", {}, _points([nan] * 10))],
        },
    )


# -- panels ------------------------------------------------------------------


def test_default_panels_come_from_the_dashboard_with_their_queries() -> None:
    panels = load_panels(titles=DEFAULT_PANELS)
    assert [p.title for p in panels] == list(DEFAULT_PANELS)
    by_title = {p.title: p for p in panels}
    latency = by_title["Request latency p50 / p95 / p99 by lane"]
    assert latency.unit == "s"
    assert [t.expr.split("(")[1].split(",")[0] for t in latency.targets] == ["0.5", "0.95", "0.99"]
    assert "pipeline_queue_depth" in by_title["Queue depth by lane"].targets[0].expr
    shedding = by_title["Circuit breaker and load-shedding level"]
    assert any("pipeline_shed_level" in t.expr for t in shedding.targets)
    assert by_title["Device utilisation (GPU) and engine busy share"].max == 1.0


def test_load_panels_skips_rows_and_names_the_known_titles_on_a_typo(tmp_path: Path) -> None:
    path = tmp_path / "dash.json"
    path.write_text(
        json.dumps(
            {
                "panels": [
                    {"type": "row", "id": 1, "title": "A row"},
                    {"type": "timeseries", "id": 2, "title": "Depth",
                     "targets": [{"refId": "A", "expr": "up", "legendFormat": "{{job}}"}]},
                ]
            }
        )
    )  # fmt: skip
    [panel] = load_panels(path)
    assert panel == Panel(2, "Depth", "short", (Target("A", "up", "{{job}}"),))
    with pytest.raises(ConfigurationError, match="Depth"):
        load_panels(path, ["Dpeth"])
    with pytest.raises(ConfigurationError, match="not found"):
        load_panels(tmp_path / "missing.json")


def test_promql_fills_the_dashboards_variables_and_refuses_unknown_ones() -> None:
    for panel in load_panels():
        for target in panel.targets:
            assert "$" not in promql(target.expr, rate_interval="4s"), panel.title
    expr = 'rate(x{lane=~"$lane",instance=~"$instance"}[$__rate_interval])'
    assert promql(expr, rate_interval="10s", lane="bulk") == (
        'rate(x{lane=~"bulk",instance=~".*"}[10s])'
    )
    with pytest.raises(ConfigurationError, match=r"\$cluster"):
        promql('x{c="$cluster"}', rate_interval="4s")


def test_rate_interval_and_legends_follow_grafana() -> None:
    assert grafana_rate_interval(1, 1) == "4s"
    assert grafana_rate_interval(15, 5) == "20s"
    assert legend("p99 {{lane}}", {"lane": "bulk"}) == "p99 bulk"
    assert legend("{{ state }}", {}) == ""
    assert legend("", {"__name__": "x", "job": "pipeline", "lane": "bulk"}) == "lane=bulk"


# -- rendering ---------------------------------------------------------------


def test_render_writes_a_png_with_one_axes_per_panel() -> None:
    png = render(PANELS, _curves(), title="t", caption="c", phases=[(0, 4, "healthy")])
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    fig = figure(PANELS, _curves(), columns=2)  # 5 panels on a 3 x 2 grid
    axes = fig.axes
    assert len(axes) == len(PANELS)
    titles = [ax.get_title() for ax in axes]
    assert titles == [
        "Latency by lane (s, log scale)",
        "Queue depth",
        "Busy (%)",
        "Nothing here (per second)",
        "Only NaN (s, log scale)",
    ]
    latency, depth, busy, empty, nan_only = axes
    assert [line.get_label() for line in latency.get_lines()] == [
        "p50 realtime",
        "p99 realtime",
        "p99 bulk",
    ]
    assert latency.get_yscale() == "log"
    # A lane keeps its colour; the tail quantile gets the solid line.
    assert latency.get_lines()[0].get_color() == latency.get_lines()[1].get_color()
    assert latency.get_lines()[1].get_linestyle() == "-"
    assert latency.get_lines()[0].get_linestyle() != "-"
    assert max(busy.get_lines()[0].get_ydata()) == pytest.approx(70.0)
    assert len(depth.get_lines()) == 3
    for ax in (empty, nan_only):
        assert not ax.get_lines()
        assert [t.get_text() for t in ax.texts] == ["no data"]
    # The time axis is seconds since the start, shared by every panel.
    assert list(depth.get_lines()[0].get_xdata()) == [float(i) for i in range(10)]
    assert all(ax.get_xlim() == (0.0, 9.0) for ax in axes)


def test_curves_survive_a_round_trip_through_json(tmp_path: Path) -> None:
    curves = _curves()
    again = load(dump(curves, tmp_path / "s.json"))
    assert again.series.keys() == curves.series.keys()
    p99 = again.series[LATENCY.title][1]
    assert p99.labels == {"lane": "realtime"} and p99.target == 1
    assert math.isnan(p99.points[1][1]) and p99.points[2] == (T0 + 2, 0.2)
    with pytest.raises(ConfigurationError, match="series file"):
        load(tmp_path / "nope.json")


# -- the command line --------------------------------------------------------


def test_render_from_saved_series_needs_no_prometheus(tmp_path: Path) -> None:
    panels = load_panels(titles=DEFAULT_PANELS[:3])
    curves = Curves(T0, T0 + 9, 1, "4s", {p.title: [] for p in panels})
    curves.series[panels[0].title].append(
        Series(0, "p50 realtime", {"lane": "realtime"}, _points([0.1] * 10))
    )
    saved = dump(curves, tmp_path / "s.json")
    out = tmp_path / "out" / "d.png"
    args = ["dashboard", "render", "--series", str(saved), "--out", str(out)]
    for title in DEFAULT_PANELS[:3]:
        args += ["--panel", title]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(b"\x89PNG")


def test_render_says_when_prometheus_does_not_answer(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "d.png"
    args = ["dashboard", "render", "--prometheus", url, "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert f"Prometheus at {url} does not answer" in result.output
    assert not out.exists()


def test_record_without_prometheus_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no prometheus binary
    result = CliRunner().invoke(main, ["dashboard", "record", "--out", str(tmp_path / "d.png")])
    assert result.exit_code == 1
    assert "`prometheus` is not on PATH" in result.output
    assert "apt-get install prometheus" in result.output


def test_help_and_panel_listing() -> None:
    runner = CliRunner()
    for sub in ("render", "record"):
        result = runner.invoke(main, ["dashboard", sub, "--help"])
        assert result.exit_code == 0 and "Examples:" in result.output
    listing = runner.invoke(main, ["dashboard", "panels"])
    assert listing.exit_code == 0
    assert "* Queue depth by lane  [short]" in listing.output
    assert "pipeline_queue_depth" in listing.output
    typo = runner.invoke(main, ["dashboard", "render", "--panel", "Queue dept"])
    assert typo.exit_code == 1
    assert "no panel titled ['Queue dept']" in typo.output and "Queue depth by lane" in typo.output


def test_scenario_plays_each_phase_at_its_rate_with_the_burst_at_the_overload() -> None:
    from pipeline.observability.dashboard.record import Scenario

    scenario = Scenario(healthy_s=20, overload_s=10, recovery_s=20, rate=5, overload_rate=20,
                        burst=50, realtime_share=0.5)  # fmt: skip
    workload = scenario.workload()
    assert workload == scenario.workload()  # seeded
    assert [r.index for r in workload] == list(range(len(workload)))
    offsets = [r.offset_ms for r in workload]
    assert offsets == sorted(offsets) and offsets[-1] < 50_000
    at_burst = [r for r in workload if r.offset_ms == 20_000.0]
    assert len(at_burst) >= 50 and {r.lane for r in at_burst[-50:]} <= {"standard", "bulk"}
    healthy = sum(1 for r in workload if r.offset_ms < 20_000)
    overload = sum(1 for r in workload if 20_000 <= r.offset_ms < 30_000) - 50
    assert 60 <= healthy <= 100 and 150 <= overload <= 200  # ~100 and ~200 expected
    realtime = sum(1 for r in workload if r.lane == "realtime")
    assert 0.35 < realtime / (len(workload) - 50) < 0.65
    assert [name for _, _, name in scenario.phases()] == ["healthy", "overload", "recovery"]
