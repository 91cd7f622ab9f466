"""What a worker process does with its environment and its logs: the event loop it
runs on (PIPELINE_WORKER_EVENT_LOOP), and no request content in its log, whatever
the request (answered, undecodable, invalid).

Importing ``pipeline.app`` sets the event loop policy for the whole process, so
the loop check runs in a child process; the log check runs a real worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from harness import Deployment

from pipeline.kafka.client import RequestProducer, request_bytes
from pipeline.tools.supervise import free_port

_LOOP = textwrap.dedent(
    """
    import asyncio
    import pipeline.app

    print(type(asyncio.get_event_loop_policy()).__module__)
    """
)


@pytest.mark.parametrize(("kind", "policy"), [("uvloop", "uvloop"), ("asyncio", "asyncio")])
def test_the_worker_runs_on_the_event_loop_its_setting_names(
    kind: str, policy: str, tmp_path: Path
) -> None:
    env = {"PIPELINE_WORKER_EVENT_LOOP": kind, "PIPELINE_WORKER_DATA_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", _LOOP],
        env={**os.environ, **env},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().split(".")[0] == policy, done.stdout


#: Appears in every request this test sends, and must appear nowhere in the log.
SECRET = "zq-private-marker-7741"


@pytest.mark.kafka
@pytest.mark.slow
def test_request_content_never_reaches_the_worker_log(kafka_bootstrap: str, tmp_path: Path) -> None:
    dep = Deployment.create(
        kafka_bootstrap, tmp_path, partitions=1,
        # JSON lines carry every ``extra`` field: the payload filter is in the path.
        PIPELINE_MODEL_TASK="noop", PIPELINE_LOG_FORMAT="json",
    )  # fmt: skip
    with dep.worker() as worker, RequestProducer(dep.settings) as producer:
        producer.send(f"an ordinary text {SECRET}", lane="standard", request_id="ok")
        # Undecodable bytes, and JSON that is not a request, both carrying the secret.
        producer.send_raw("standard", SECRET.encode(), b"\x00" + SECRET.encode())
        producer.send_raw("standard", None, json.dumps({"txt": SECRET}).encode())
        # A valid encoding of an invalid request (blank text), the secret in its metadata.
        _rid, blank = request_bytes("   ", request_id="blank", metadata={"note": SECRET})
        producer.send_raw("bulk", None, blank)
        producer.flush()
        answers = dep.answers(expect=4)
        log = worker.log()
    assert sorted(a.kind for a in answers) == ["dead_letter"] * 3 + ["result"]
    assert "dead letter" in log  # the log did speak about these requests
    assert SECRET not in log, [line for line in log.splitlines() if SECRET in line][:5]


#: Lines a person running a worker should never have to read past (issue 16, item 10).
NOISE = ("Loading weights", "loss_type", "nanobind", "event loop stalled", "_created")


@pytest.mark.kafka
@pytest.mark.slow
def test_a_worker_with_the_real_model_logs_no_library_noise_and_serves_no_created_series(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A MiniLM worker started, asked once and stopped with SIGTERM: its whole log
    (exit included) has none of the libraries' noise, and /metrics no ``*_created``."""
    import urllib.request

    dep = Deployment.create(kafka_bootstrap, tmp_path, partitions=1)
    port = free_port()
    with (
        dep.worker(PIPELINE_METRICS_PORT=str(port)) as worker,
        RequestProducer(dep.settings) as producer,
    ):
        producer.send("a short text", lane="standard", request_id="one")
        producer.flush()
        assert len(dep.answers(expect=1)) == 1
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
            metrics = page.read().decode()
    log = worker.log()  # read after the worker exited: its last lines are in
    assert "pipeline_requests_completed_total" in metrics
    assert "_created" not in metrics
    noisy = [line for line in log.splitlines() if any(n in line for n in NOISE)]
    assert noisy == [], noisy[:5]


@pytest.mark.kafka
@pytest.mark.slow
def test_json_logs_are_json_from_the_first_line(kafka_bootstrap: str, tmp_path: Path) -> None:
    """With PIPELINE_LOG_FORMAT=json every log line of a worker is a JSON object, Faust's
    start-up lines included; only the banner table printed on stdout is not (the
    command's ``--quiet`` drops it; the harness's worker runs without it)."""
    dep = Deployment.create(
        kafka_bootstrap, tmp_path, partitions=1,
        PIPELINE_MODEL_TASK="noop", PIPELINE_LOG_FORMAT="json",
    )  # fmt: skip
    with dep.worker() as worker:
        pass
    lines = [line for line in worker.log().splitlines() if line.strip()]
    banner = [line for line in lines if line[:1] in "+|"]
    others = [line for line in lines if line[:1] not in "+|"]
    not_json = []
    for line in others:
        try:
            json.loads(line)
        except ValueError:
            not_json.append(line)
    assert banner and others
    assert not_json == [], not_json[:5]
    assert any("worker starting" in json.loads(line)["msg"] for line in others)


@pytest.mark.kafka
@pytest.mark.slow
def test_sigusr2_leaves_the_worker_serving_without_a_debugger(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """mode's Worker starts pdb on the event loop for SIGUSR2; the pipeline's logs one
    line instead, and the worker goes on answering."""
    dep = Deployment.create(kafka_bootstrap, tmp_path, partitions=1, PIPELINE_MODEL_TASK="noop")
    with dep.worker() as worker, RequestProducer(dep.settings) as producer:
        worker.proc.send_signal(signal.SIGUSR2)
        producer.send("asked after the signal", lane="standard", request_id="after")
        producer.flush()
        assert [a.kind for a in dep.answers(expect=1)] == ["result"]
        assert worker.proc.poll() is None
    log = worker.log()
    assert "SIGUSR2 ignored" in log, log[-3000:]
    assert "Starting debugger" not in log, log[-3000:]


@pytest.mark.kafka
@pytest.mark.slow
def test_a_native_crash_leaves_the_python_stacks_in_the_worker_log(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A worker that dies of SIGSEGV (a fault in RocksDB, librdkafka or torch) logs
    Python's fault handler's report, every thread's stack, before it goes."""
    dep = Deployment.create(kafka_bootstrap, tmp_path, partitions=1, PIPELINE_MODEL_TASK="noop")
    worker = dep.spawn()
    try:
        worker.wait_ready()
        worker.proc.send_signal(signal.SIGSEGV)
        code = worker.proc.wait(60)
    finally:
        worker.stop()
    log = worker.log()
    assert code == -signal.SIGSEGV, log[-3000:]
    assert "Fatal Python error: Segmentation fault" in log, log[-3000:]
    assert "Thread 0x" in log and "most recent call first" in log, log[-3000:]
