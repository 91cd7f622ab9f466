"""ops/: the dashboard and alert rules name only metrics that
pipeline.observability.metrics exports, promtool accepts the Prometheus files,
and a real Prometheus scrapes a real endpoint."""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.ops import PROMTOOL, needs_prometheus, needs_promtool, populated

from pipeline.observability.dashboard import fetch, figure, load_panels
from pipeline.observability.dashboard.prometheus import LocalPrometheus, scrape_config
from pipeline.observability.metrics import PREFIX, PipelineMetrics, start_metrics_server
from pipeline.settings import MetricsSettings
from pipeline.tools.supervise import free_port

ROOT = Path(__file__).resolve().parents[3]
OPS = ROOT / "ops"
PROMETHEUS_YML = OPS / "prometheus" / "prometheus.yml"
ALERTS_YML = OPS / "prometheus" / "alerts.yml"
DASHBOARD = OPS / "grafana" / "dashboards" / "pipeline.json"
PROVISIONING = OPS / "grafana" / "provisioning"


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_IDENT = re.compile(rf"(?<![A-Za-z0-9_:]){PREFIX}[A-Za-z0-9_]+")


def _dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, and template queries."""
    out: list[tuple[str, str]] = []
    for panel in _dashboard()["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    for var in _dashboard()["templating"]["list"]:
        if var["type"] == "query":
            out.append((f"${var['name']}", var["definition"]))
    return out


def alert_exprs() -> list[tuple[str, str]]:
    rules = yaml.safe_load(ALERTS_YML.read_text())
    return [(r["alert"], r["expr"]) for g in rules["groups"] for r in g["rules"]]


def series_names(metrics: PipelineMetrics) -> set[str]:
    """Every sample name the facade exports once each method has been called."""
    return {s.name for fam in metrics.registry.collect() for s in fam.samples}


def identifiers(expr: str) -> set[str]:
    """Names starting with the metric prefix, outside string literals."""
    return set(_IDENT.findall(_STRING.sub('""', expr)))


def test_identifier_parsing_ignores_strings_and_recording_rule_names() -> None:
    expr = 'sum(rate(pipeline_a_total{job="pipeline_x"}[5m])) / lane:pipeline_b:rate5m'
    assert identifiers(expr) == {"pipeline_a_total"}


@pytest.mark.parametrize(("where", "expr"), dashboard_exprs() + alert_exprs())
def test_expression_names_only_exported_metrics(where: str, expr: str) -> None:
    names = identifiers(expr)
    unknown = names - series_names(populated())
    assert not unknown, (
        f"{where}: {sorted(unknown)} not exported by pipeline/observability/metrics.py"
    )


def test_dashboard_and_alerts_use_every_important_family() -> None:
    text = " ".join(e for _, e in dashboard_exprs())
    for family in (
        "pipeline_device_utilisation_ratio",
        "pipeline_request_latency_seconds_bucket",
        "pipeline_batch_size_bucket",
        "pipeline_token_budget",
        "pipeline_queue_depth",
        "pipeline_dead_letters_total",
        "pipeline_dedupe_hits_total",
        "pipeline_consumer_lag",
    ):
        assert family in text, family
    alerts = {name for name, _ in alert_exprs()}
    assert {"RealtimeSLAMisses", "DeadLetterRateHigh", "ConsumerLagHigh"} <= alerts
    assert "DeviceIdleUnderBacklog" in alerts


def test_dashboard_panels_are_well_formed() -> None:
    dash = _dashboard()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    datasource = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())
    uid = datasource["datasources"][0]["uid"]
    for panel in dash["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == uid, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]


def test_dashboard_provider_points_where_compose_mounts_the_dashboards() -> None:
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "pipeline.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./ops/grafana/dashboards:{path}:ro" in mounts


def test_prometheus_scrapes_the_worker_port_compose_sets() -> None:
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "pipeline")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    worker_env = compose["services"]["worker"]["environment"]
    for sd in job["dns_sd_configs"]:
        assert str(sd["port"]) == worker_env["PIPELINE_METRICS_PORT"]
        assert "worker" in sd["names"]
    assert MetricsSettings().port == 9108


@needs_promtool
def test_promtool_accepts_the_alert_rules() -> None:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "check", "rules", str(ALERTS_YML)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(alert_exprs())} rules found" in done.stdout + done.stderr


@needs_promtool
def test_promtool_accepts_the_prometheus_config() -> None:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "check", "config", str(PROMETHEUS_YML)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# -- a real Prometheus ------------------------------------------------------


@dataclass
class RunningPrometheus:
    url: str
    metrics: PipelineMetrics
    server: LocalPrometheus

    def api(self, path: str, **params: str) -> dict[str, Any]:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as resp:
                body: dict[str, Any] = json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # 400 carries the parse error as JSON
            body = json.loads(exc.read())
        return body

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = self.api("/api/v1/query", query=expr)
        assert body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def wait_for(self, expr: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        return self.server.wait_for(expr, timeout_s)


def test_scrape_config_aims_the_pipeline_job_at_the_targets() -> None:
    config = scrape_config(["127.0.0.1:1234"], interval_s=1.0)
    assert [j["job_name"] for j in config["scrape_configs"]] == ["pipeline"]
    assert config["scrape_configs"][0]["static_configs"] == [{"targets": ["127.0.0.1:1234"]}]
    assert config["global"]["scrape_interval"] == "1s"
    assert all(Path(f).is_file() for f in config["rule_files"])


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningPrometheus]:
    """A real Prometheus (1 s scrapes) of an in-process endpoint serving ``populated()``."""
    metrics = populated()
    server = start_metrics_server(MetricsSettings(port=free_port()), metrics)
    assert server is not None
    local = LocalPrometheus(
        [f"127.0.0.1:{server.port}"], tmp_path_factory.mktemp("prometheus"), interval_s=1.0
    )
    try:
        with local:
            yield RunningPrometheus(local.url, metrics, local)
    finally:
        server.close()


@needs_prometheus
def test_real_prometheus_scrapes_values_recorded_through_the_facade(
    prometheus: RunningPrometheus,
) -> None:
    result = prometheus.wait_for('pipeline_requests_received_total{lane="realtime"}')
    assert float(result[0]["value"][1]) == 2
    assert result[0]["metric"]["job"] == "pipeline"
    # A value recorded after the first scrape shows up in a later one.
    prometheus.metrics.queue_depth("realtime", 42)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        depth = prometheus.query('pipeline_queue_depth{lane="realtime"}')
        if depth and float(depth[0]["value"][1]) == 42:
            break
        time.sleep(0.5)
    else:
        raise AssertionError("the new queue depth never reached Prometheus")
    up = prometheus.query('up{job="pipeline"}')
    assert float(up[0]["value"][1]) == 1


@needs_prometheus
def test_real_prometheus_loads_every_alert_rule(prometheus: RunningPrometheus) -> None:
    body = prometheus.api("/api/v1/rules")
    loaded = {r["name"] for g in body["data"]["groups"] for r in g["rules"]}
    assert loaded == {name for name, _ in alert_exprs()}
    assert all(r["health"] != "err" for g in body["data"]["groups"] for r in g["rules"])


@needs_prometheus
def test_real_prometheus_parses_every_dashboard_query(prometheus: RunningPrometheus) -> None:
    prometheus.wait_for("pipeline_token_budget")
    for title, expr in dashboard_exprs():
        if expr.startswith("label_values("):  # a Grafana function, not PromQL
            metric = expr[len("label_values(") :].split(",")[0]
            assert prometheus.query(metric), title
            continue
        promql = (
            expr.replace("$__rate_interval", "1m").replace("$instance", ".*").replace("$lane", ".*")
        )
        assert "$" not in promql, (title, promql)
        prometheus.query(promql)  # asserts status success: the query parses and runs


@needs_prometheus
def test_every_panel_draws_from_real_prometheus_query_range(
    prometheus: RunningPrometheus,
) -> None:
    prometheus.wait_for("pipeline_token_budget")
    # Two scrapes at least, so that rate() over the panels' window has an answer.
    prometheus.wait_for("rate(pipeline_requests_received_total[30s])")
    panels = load_panels()
    now = time.time()
    curves = fetch(
        prometheus.server.client, panels, start=now - 60, end=now, step_s=1, rate_interval="30s"
    )
    assert set(curves.series) == {p.title for p in panels}
    depth = curves.series["Queue depth by lane"]
    assert {s.labels.get("lane") for s in depth} >= {"realtime", "standard", "bulk"}
    budget = [s for s in curves.series["Token budget and padded tokens per batch"] if s.target == 0]
    assert budget and any(math.isfinite(v) and v > 0 for _, v in budget[0].points)
    assert len(figure(panels, curves).axes) == len(panels)
