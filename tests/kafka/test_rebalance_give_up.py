"""A rebalance gives up queued work instead of waiting for it, and nothing is lost.

Real broker, two real worker processes running MiniLM on one torch thread, so a
backlog of a few hundred long texts sits in the first worker's scheduler queue
(many seconds of work) when the second one joins. The first worker abandons what
it has not started, its offsets stay uncommitted, and the ledger still finds one
answer per request.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from harness import Deployment
from ledger import check_ledger

from pipeline.client import RequestProducer

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(600)]

FAST_GROUP = {"BROKER_SESSION_TIMEOUT": "6", "BROKER_HEARTBEAT_INTERVAL": "1"}
GIVEN_UP = re.compile(r"rebalance: (\d+) inputs not yet started given up")


def _wait_for(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def test_a_joining_worker_does_not_wait_for_the_queued_backlog(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    requests = 400
    dep = Deployment.create(
        kafka_bootstrap,
        tmp_path,
        partitions=2,
        PIPELINE_MODEL_TORCH_THREADS="1",
        PIPELINE_DEGRADE_ENABLED="false",
        PIPELINE_DEDUPE_ENABLED="false",
        PIPELINE_METRICS_SAMPLE_INTERVAL_S="60",
    )
    words = " ".join(f"word{i}" for i in range(120))
    with dep.worker("worker-0", **FAST_GROUP) as first:
        with RequestProducer(dep.settings) as producer:
            for i in range(requests):
                producer.send(f"{i} {words}", lane="bulk", request_id=f"backlog-{i}")
        # Positive signal that the backlog reached the worker: its first answers.
        answers = dep.answers(expect=5, timeout_s=120)
        assert len(answers) == 5
        with dep.worker("worker-1", **FAST_GROUP):
            _wait_for(lambda: GIVEN_UP.search(first.log()), 120, "worker-0 never gave up work")
            match = GIVEN_UP.search(first.log())
            assert match is not None and int(match.group(1)) > 0
            summary = check_ledger(
                dep.settings, max_duplicates=requests, expect_inputs=requests, timeout_s=300
            )
    assert summary["missing"] == 0
