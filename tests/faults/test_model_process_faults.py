"""Fault injection on the model process: the worker's child that runs the network is
SIGKILLed under load, three times; the worker itself stays up, restarts the child
within its bound, and the ledger shows every input answered once (no worker died,
so no input is redelivered: no duplicates are allowed)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from ledger import check_ledger
from test_faults import SteadyProducer, _deploy, _report

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(600)]


def _model_process(worker_pid: int, timeout_s: float = 60.0) -> int:
    """The pid of the worker's model process (its child: pipeline.inference.process_child)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for task in Path(f"/proc/{worker_pid}/task").iterdir():
            for pid in (task / "children").read_text().split():
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"pipeline.inference.process_child" in cmdline:
                    return int(pid)
        time.sleep(0.2)
    raise AssertionError(f"worker {worker_pid} has no model process after {timeout_s:.0f}s")


def test_model_process_killed_under_load_nothing_lost(
    kafka_bootstrap: str, tmp_path: Path, tiny_dir: Path
) -> None:
    dep = _deploy(kafka_bootstrap, tmp_path, tiny_dir, PIPELINE_MODEL_PROCESS="on")
    killed: list[int] = []
    with dep.worker() as worker, SteadyProducer(dep, rate=20) as load:
        for _ in range(3):
            time.sleep(3.0)  # load phase: 3 s of serving before each kill (a duration)
            pid = _model_process(worker.pid)
            assert pid not in killed, "the killed model process was not replaced"
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        time.sleep(3.0)  # serving again after the last kill
        load.stop()
        summary = check_ledger(dep.settings, max_duplicates=0, expect_inputs=load.expected)
        assert worker.proc.poll() is None, "the worker exited"
        assert _model_process(worker.pid) not in killed
        log = worker.log()
    assert summary["dead_letters"] == 0, log[-3000:]
    assert log.count("restarting the model process") == 3
    _report("sigkill-model-process", summary, kills=3, sent=load.sent)
