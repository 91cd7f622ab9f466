"""An answer whose fate is unknown stops the worker loudly (README, "Guarantees").

A real broker (this test's own) and a real worker process. A request waits in
the worker's scheduler (a long batch window); meanwhile the broker is frozen
(SIGSTOP), so the result's delivery is never acknowledged within
``PIPELINE_WORKER_ANSWER_TIMEOUT_MS``: it may or may not be written. The worker
must not answer the input a second way (no dead letter, no resend by Python),
must say why with a CRITICAL line, and must stop by itself with a non-zero exit
and the input uncommitted. A restarted worker answers the input.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from harness import Deployment

from pipeline.kafka.client import RequestProducer
from pipeline.kafka.security import client_config
from pipeline.tools.supervise import WorkerProcess, free_port

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _received(port: int) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("pipeline_requests_received_total")
    )


def _committed(dep: Deployment, topic: str) -> int:
    consumer = Consumer({**client_config(dep.settings), "group.id": dep.settings.worker.app_id})
    try:
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        return int(tp.offset)
    finally:
        consumer.close()


def _until(what: str, check: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.2)


def test_a_result_of_unknown_fate_stops_the_worker_and_the_input_comes_back(
    make_local_kafka: Any, tmp_path: Path
) -> None:
    broker = make_local_kafka()
    broker.up()
    dep = Deployment.create(broker.bootstrap, tmp_path, partitions=1)
    lane = dep.settings.topics.lane_topic("bulk")
    port = free_port()
    worker: WorkerProcess
    with dep.worker(
        PIPELINE_WORKER_ANSWER_TIMEOUT_MS="3000",
        PIPELINE_SCHEDULER_WINDOW_MS="8000",  # the request waits here while the broker freezes
        PIPELINE_METRICS_PORT=str(port),
    ) as worker:
        with RequestProducer(dep.settings) as producer:
            producer.send(
                "a text whose answer is never acknowledged", lane="bulk", request_id="lost"
            )
            producer.flush()
        _until("the worker took the request", lambda: _received(port) >= 1, 60)
        pid = broker.read_pid()
        assert pid is not None
        os.killpg(pid, signal.SIGSTOP)
        try:
            _until("the worker gave up", lambda: "the answer path failed" in worker.log(), 60)
        finally:
            os.killpg(pid, signal.SIGCONT)
        code = worker.proc.wait(60)  # it stops by itself; TimeoutExpired fails the test
        log = worker.log()
    assert code != 0, "a worker that gave up on an answer must exit non-zero"
    assert "CRITICAL" in log and "may or may not be written" in log, log[-3000:]
    assert _committed(dep, lane) < 1, "the unanswered input must stay uncommitted"
    with dep.worker():
        answers = dep.answers(expect=1, timeout_s=90)
        _until("the input is committed", lambda: _committed(dep, lane) == 1, 60)
    assert {(a.kind, a.record["request_id"]) for a in answers} == {("result", "lost")}
