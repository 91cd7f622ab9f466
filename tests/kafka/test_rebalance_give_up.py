"""A rebalance gives up queued work instead of waiting for it, and nothing is lost.

Real broker, two real worker processes running MiniLM on one torch thread, so a
backlog of a few hundred long texts sits in the first worker's scheduler queue
(many seconds of work) when the second one joins. The first worker abandons what
it has not started, its offsets stay uncommitted, and the ledger still finds one
answer per request.

Repeats are bounded by what the workers log at each give-up. A revoke commits
what was answered before it (``faust_edge.consumer._commit_then_revoke``), waits for the
inputs the model had started and commits their answers too (Faust's
``wait_empty``), and given-up inputs are never answered by the worker that gave
them up. Left to repeat are only the inputs a give-up strands: started or
answered at an offset past a given-up one in the same partition, which no commit
may cover and the revoke does not wait for. The worker logs their number ("N
more wait behind them"); with one lane of equally long texts the scheduler takes
them in offset order, so it is usually 0 and so are the repeats.

A revoke that loses its own commit is mostly hidden here: Faust's commit in
``wait_empty`` covers a partition's earlier answers as soon as one of its
started inputs is acked after the revoke began, and a batch of MiniLM inputs
usually spans both partitions. test_offset_holes.py's revoke test, with one
input in flight, is the one that catches it.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from harness import Deployment
from ledger import check_ledger

from pipeline.kafka.client import RequestProducer

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(600)]

FAST_GROUP = {"BROKER_SESSION_TIMEOUT": "6", "BROKER_HEARTBEAT_INTERVAL": "1"}
GIVEN_UP = re.compile(
    r"rebalance: (\d+) inputs not yet started given up \(read again by the "
    r"partitions' next owners\); (\d+) more wait behind them"
)
#: faust_edge's warning when the commit at a revoke fails: its answers repeat then.
REVOKE_COMMIT_FAILED = "commit at the revoke failed"


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
        with dep.worker("worker-1", **FAST_GROUP) as second:
            _wait_for(lambda: GIVEN_UP.search(first.log()), 120, "worker-0 never gave up work")
            # Repeats are bounded below, once every give-up of the run is in the logs;
            # the ledger returns after the group committed every input, so no answer
            # comes after it.
            summary = check_ledger(
                dep.settings, max_duplicates=requests, expect_inputs=requests, timeout_s=300
            )
            logs = first.log() + second.log()
    give_ups = [(int(m[1]), int(m[2])) for m in GIVEN_UP.finditer(logs)]
    given_up = sum(g for g, _ in give_ups)
    stranded = sum(s for _, s in give_ups)
    print(summary, f"give-ups (given up, stranded behind them): {give_ups}")
    assert summary["missing"] == 0
    # A worker that answered what it gave up would repeat all of it: this run tells
    # that apart only when it gave up more than the bound allows.
    assert given_up > stranded, give_ups
    assert summary["duplicates"] <= stranded, (
        summary,
        give_ups,
        f"commits at a revoke failed: {logs.count(REVOKE_COMMIT_FAILED)}",
    )
