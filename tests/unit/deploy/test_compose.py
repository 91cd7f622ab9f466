"""docker-compose.yml, the Dockerfile and ops/kafka/pom.xml agree with the package."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import yaml

from pipeline.settings import KAFKA_VERSION

ROOT = Path(__file__).resolve().parents[3]


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    services: dict[str, Any] = data["services"]
    return services


def test_kafka_image_matches_the_local_broker_version() -> None:
    image, tag = _compose()["kafka"]["image"].split(":")
    assert image == "apache/kafka"
    assert tag == KAFKA_VERSION


def test_pom_resolves_the_same_kafka_version() -> None:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    root = ET.parse(ROOT / "ops" / "kafka" / "pom.xml").getroot()
    assert root.findtext("m:properties/m:kafka.version", namespaces=ns) == KAFKA_VERSION


def test_kafka_is_single_node_kraft_with_a_healthcheck() -> None:
    kafka = _compose()["kafka"]
    env = kafka["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert str(env["KAFKA_NODE_ID"]) == "1"
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert "test" in kafka["healthcheck"]


def test_topics_run_once_the_broker_is_healthy() -> None:
    topics = _compose()["topics"]
    assert topics["command"] == ["pipeline", "topics", "create"]
    assert topics["environment"]["PIPELINE_KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert topics["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_worker_is_the_faust_worker_after_topics() -> None:
    worker = _compose()["worker"]
    assert worker["command"][:6] == ["faust", "--quiet", "-A", "pipeline.app", "worker", "-l"]
    assert worker["build"] == "."
    env = worker["environment"]
    assert env["PIPELINE_KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert env["PIPELINE_WORKER_WEB_HOST"] == "0.0.0.0"
    assert worker["depends_on"]["topics"]["condition"] == "service_completed_successfully"


def test_dockerfile_builds_the_package_on_python_311() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "FROM python:3.11-slim" in text
    # The image installs the versions the suite passed with (constraints.txt).
    assert "pip install --no-cache-dir -c constraints.txt -e ." in text


def test_every_pipeline_variable_in_compose_is_a_known_setting() -> None:
    from pipeline.settings import Settings

    checked = set()
    for name, service in _compose().items():
        env = service.get("environment") or {}
        pipeline_env = {
            k: _interpolated(str(v)) for k, v in env.items() if k.startswith("PIPELINE_")
        }
        Settings.from_env(pipeline_env)  # raises on an unknown or invalid variable
        if pipeline_env:
            checked.add(name)
    # The check saw the services that configure the pipeline.
    assert {"worker", "worker-gpu"} <= checked, checked


def test_workers_serve_metrics_and_scale_without_shared_state() -> None:
    services = _compose()
    for name in ("worker", "worker-gpu"):
        worker = services[name]
        env = worker["environment"]
        assert env["PIPELINE_METRICS_HOST"] == "0.0.0.0"
        assert env["PIPELINE_METRICS_PORT"] == "9108"
        assert "9108" in worker["expose"]
        assert "ports" not in worker, "a fixed host port breaks --scale"
        assert not any(":/" in v for v in worker.get("volumes", [])), "no shared RocksDB folder"
        assert "9108/metrics" in " ".join(worker["healthcheck"]["test"])


def test_gpu_worker_is_optional_and_reserves_an_nvidia_device() -> None:
    gpu = _compose()["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["environment"]["PIPELINE_MODEL_DEVICE"] == "cuda"
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]


def test_prometheus_and_grafana_mount_ops_and_have_healthchecks() -> None:
    services = _compose()
    prom, grafana = services["prometheus"], services["grafana"]
    assert "./ops/prometheus:/etc/prometheus:ro" in prom["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom["command"]
    assert "./ops/grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"]
    assert grafana["depends_on"]["prometheus"]["condition"] == "service_healthy"
    for service in (prom, grafana):
        assert "test" in service["healthcheck"]
        assert all(p.startswith("127.0.0.1:") for p in service["ports"])
    assert (ROOT / "ops" / "prometheus" / "prometheus.yml").is_file()
    assert (ROOT / "ops" / "grafana" / "provisioning" / "datasources").is_dir()


def test_the_fleets_profile_splits_the_lanes_between_two_consumer_groups() -> None:
    from pipeline.settings import LANES, Settings

    services = _compose()
    groups: list[str] = []
    lanes: list[str] = []
    for name in ("worker-realtime", "worker-batch"):
        service = services[name]
        assert service["profiles"] == ["fleets"]
        env = service["environment"]
        worker = Settings.from_env(
            {k: _interpolated(str(v)) for k, v in env.items() if k.startswith("PIPELINE_")}
        ).worker
        groups.append(worker.app_id)
        lanes += worker.consumed_lanes()
    # Every lane in exactly one fleet; each fleet its own group, not the mixed worker's.
    assert sorted(lanes) == sorted(LANES)
    assert len(set(groups)) == 2
    assert Settings.from_env({}).worker.app_id not in groups
    prometheus = yaml.safe_load((ROOT / "ops" / "prometheus" / "prometheus.yml").read_text())
    job = next(j for j in prometheus["scrape_configs"] if j["job_name"] == "pipeline")
    (sd,) = job["dns_sd_configs"]
    assert {"worker-realtime", "worker-batch"} <= set(sd["names"])


def _interpolated(value: str) -> str:
    """``value`` as Compose passes it with nothing set in the shell: ``${NAME:-default}``
    becomes ``default``."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)
