"""``./run demo``, the README's main command, end to end: its own broker on free ports,
a worker, every sample answered, and what it started stopped again."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from support import free_ports, require

from pipeline.settings import Settings
from pipeline.tools.kafka_local import LocalKafka

ROOT = Path(__file__).resolve().parents[2]


def _setup_is_current() -> bool:
    """Whether ``./run`` would skip reinstalling (it stamps .venv/.installed with the
    sha256 of pyproject.toml and constraints.txt); a test must not reinstall the venv."""
    stamp = ROOT / ".venv" / ".installed"
    want = hashlib.sha256(
        (ROOT / "pyproject.toml").read_bytes() + (ROOT / "constraints.txt").read_bytes()
    ).hexdigest()
    return stamp.is_file() and stamp.read_text().strip() == want


@pytest.mark.kafka
@pytest.mark.slow
def test_run_demo_answers_every_sample_and_stops_what_it_started(tmp_path: Path) -> None:
    require(_setup_is_current(), "an up-to-date .venv (run ./run setup; ./run tests does)")
    names = ["LOCAL_KAFKA_PORT", "LOCAL_KAFKA_CONTROLLER_PORT", "WORKER_WEB_PORT", "METRICS_PORT"]
    ports = {f"PIPELINE_{n}": str(p) for n, p in zip(names, free_ports(4), strict=True)}
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PIPELINE_", "KAFKA_"))},
        **ports,
        "PIPELINE_LOCAL_KAFKA_DATA_DIR": str(tmp_path / "kafka"),
        "PIPELINE_WORKER_DATA_DIR": str(tmp_path / "worker"),
    }
    done = subprocess.run(
        [str(ROOT / "run"), "demo"], env=env, cwd=tmp_path,
        capture_output=True, text=True, timeout=500, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "all 12 requests answered" in done.stdout, done.stdout
    assert "stopping the worker" in done.stderr and "stopping the local broker" in done.stderr
    worker_log = (tmp_path / "worker.demo.log").read_text()
    assert "start-up objects frozen, young generation every 100000" in worker_log
    assert "switch interval 1 ms" in worker_log  # app.SWITCH_INTERVAL_S, once serving
    broker = LocalKafka(Settings.from_env(env).local_kafka)
    assert broker.status()["running"] is False, "the demo left its broker running"
