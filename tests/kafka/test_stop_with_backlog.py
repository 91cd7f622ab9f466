"""SIGTERM with a backlog queued: the worker gives up what the model has not started,
as a rebalance does, and stops after the running batch and its answers.

A real broker and a real MiniLM worker, 2,000 requests queued at once. Once it has
answered some, SIGTERM: the answers published after the signal are at most the
inputs that were in flight then (the running batch and the one being published:
2 x ``PIPELINE_SCHEDULER_MAX_ITEMS``), Faust never waits for the backlog ("Waiting
for tasks"), and the worker exits cleanly. What it gave up is read again by the next
worker: every request answered, none twice past that bound (the ledger).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from harness import Deployment
from ledger import Ledger, check_ledger

from pipeline.kafka.client import RequestProducer

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(600)]

REQUESTS = 2000
MAX_ITEMS = 32


def test_sigterm_with_a_backlog_waits_for_the_running_batch_only(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    dep = Deployment.create(
        kafka_bootstrap,
        tmp_path,
        partitions=3,
        PIPELINE_SCHEDULER_MAX_ITEMS=str(MAX_ITEMS),
        PIPELINE_DEDUPE_ENABLED="false",
    )
    worker = dep.spawn()
    try:
        worker.wait_ready()
        with RequestProducer(dep.settings) as producer:
            for i in range(REQUESTS):
                text = f"backlog request {i}: where is my order, it was due on monday"
                producer.send(text, lane="bulk", request_id=f"b-{i}")
        assert len(dep.answers(expect=50, timeout_s=120)) == 50  # the backlog is served
        signalled_ms = time.time() * 1000
        worker.proc.send_signal(signal.SIGTERM)
        code = worker.proc.wait(120)
    finally:
        worker.stop()
    log = worker.log()
    assert code == 0, log[-3000:]
    assert "Waiting for tasks" not in log, log[-3000:]
    assert "inputs not yet started given up" in log, log[-3000:]

    ledger = Ledger(dep.settings)
    ledger.read(time.monotonic() + 30)
    late = [
        r
        for results in ledger.results.values()
        for r in results
        if r["completed_at_ms"] > signalled_ms
    ]
    answered = sum(len(r) for r in ledger.results.values())
    print(f"answered before the stop: {answered}; after the signal: {len(late)}")
    assert answered < REQUESTS  # a backlog was left
    assert len(late) <= 2 * MAX_ITEMS, len(late)

    with dep.worker("worker-1"):
        summary = check_ledger(
            dep.settings, max_duplicates=2 * MAX_ITEMS, expect_inputs=REQUESTS, timeout_s=240
        )
    assert summary["missing"] == 0
