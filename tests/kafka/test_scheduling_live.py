"""The scheduler's promises on the real broker with a real worker and the real model."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from harness import Deployment

from pipeline.kafka.client import RequestProducer
from pipeline.worker.answers import EXPIRED_LOG_S

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _bulk_texts(n: int) -> list[str]:
    return [f"bulk document {i}: quarterly figures for region {i % 7} rose again" for i in range(n)]


def test_realtime_sent_after_queued_bulk_is_answered_first(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    dep = Deployment.create(
        kafka_bootstrap,
        tmp_path,
        partitions=1,
        # generous realtime deadline: this test is about order, not expiry
        PIPELINE_WORKER_LANE_DEADLINE_MS_REALTIME="20000",
    )
    # Texts of about 60 tokens: 400 of them keep the worker busy for seconds.
    filler = "the quarterly figures for the northern region rose again, " * 5
    with dep.worker(), RequestProducer(dep.settings) as producer:
        for i in range(400):
            producer.send(f"bulk document {i}: {filler}", lane="bulk", request_id=f"bulk-{i}")
        producer.flush()
        dep.answers(expect=1)  # the worker is working through the bulk backlog
        realtime_sent_ms = time.time() * 1000
        for i in range(5):
            producer.send(f"urgent question number {i}", lane="realtime", request_id=f"rt-{i}")
        producer.flush()
        answers = dep.answers(expect=405, timeout_s=300)
    done = {a.record["request_id"]: a.record["completed_at_ms"] for a in answers}
    assert len(done) == 405
    bulk = [done[f"bulk-{i}"] for i in range(400)]
    backlog = sum(t > realtime_sent_ms for t in bulk)
    assert backlog >= 100, f"premise: only {backlog} bulk left when realtime was sent"
    last_realtime = max(done[f"rt-{i}"] for i in range(5))
    overtaken = sum(t > last_realtime for t in bulk)
    # Realtime waits for the batch running and the one formed next, then rides in
    # the batch after: at most three batches (max_items 32) of bulk go before it.
    assert overtaken >= backlog - 3 * 32, (overtaken, backlog)


def test_burst_pauses_and_resumes_bulk_without_losing_anything(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    dep = Deployment.create(
        kafka_bootstrap,
        tmp_path,
        partitions=1,
        PIPELINE_SCHEDULER_QUEUE_SIZE="16",
        PIPELINE_BATCH_MAX_INFLIGHT="64",
    )
    with dep.worker() as worker, RequestProducer(dep.settings) as producer:
        rids = {producer.send(t, lane="bulk") for t in _bulk_texts(300)}
        producer.flush()
        answers = dep.answers(expect=300, timeout_s=300)
        log = worker.log()
    assert {a.record["request_id"] for a in answers} == rids
    assert all(a.kind == "result" for a in answers)
    assert "lane bulk paused: queue at its bound" in log
    assert "lane bulk resumed" in log


def test_overload_sheds_in_order_and_recovers(kafka_bootstrap: str, tmp_path: Path) -> None:
    dep = Deployment.create(
        kafka_bootstrap,
        tmp_path,
        partitions=1,
        PIPELINE_WORKER_EXPIRE_LANES="realtime",
        PIPELINE_DEGRADE_MIN_SAMPLES="4",
        PIPELINE_DEGRADE_WINDOW_MS="3000",
        PIPELINE_DEGRADE_COOLDOWN_MS="400",
        PIPELINE_DEGRADE_HOLD_MS="5000",
    )
    with dep.worker() as worker, RequestProducer(dep.settings) as producer:
        # Realtime requests that cannot make their deadline, each one a miss, until
        # the shedder is at its top level (hold_ms is far longer than a round, so
        # it cannot step down meanwhile).
        sent = 0
        deadline = time.monotonic() + 120
        while _levels(worker.log())[-1:] != [3]:
            assert time.monotonic() < deadline, _shed_lines(worker.log())
            for _ in range(6):
                producer.send(
                    "too late already", lane="realtime", deadline_ms=int(time.time() * 1000) - 1
                )
                sent += 1
            producer.flush()
            time.sleep(0.3)  # the rate of misses, not a synchronisation
        answers = dep.answers(expect=sent, timeout_s=120)
        # then a quiet, healthy period: the shedder steps back down on its own
        deadline = time.monotonic() + 120
        while _levels(worker.log())[-1:] != [0]:
            assert time.monotonic() < deadline, _shed_lines(worker.log())
            time.sleep(0.5)
        lines = _shed_lines(worker.log())
        # Every expiry is counted in the log, the flood's last ones too, once their
        # window ends (not only at the next expiry, which never comes here).
        deadline = time.monotonic() + EXPIRED_LOG_S + 30
        while _expired_logged(worker.log()) < sent:
            assert time.monotonic() < deadline, (_expired_logged(worker.log()), sent)
            time.sleep(0.5)
    assert _expired_logged(worker.log()) == sent
    assert all(a.record["stage"] == "expired" for a in answers)
    assert _levels("\n".join(lines)) == [1, 2, 3, 2, 1, 0], lines
    # Counted in the log, not a line each (the first at once, then one per 10 s).
    log = worker.log()
    assert "expired requests dead-lettered: 1 (realtime 1) since the last such line" in log
    assert log.count("dead letter: ") == 0 and log.count("dead-lettered: ") < sent


def _expired_logged(log: str) -> int:
    """The expired requests the worker's summary lines count."""
    return sum(int(n) for n in re.findall(r"expired requests dead-lettered: (\d+)", log))


def _shed_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "load shedding " in line]


def _levels(log: str) -> list[int]:
    """The shedding levels the worker moved to, in order."""
    return [int(m) for line in _shed_lines(log) for m in re.findall(r"-> (\d)", line)]


#: Long enough that the request sent once the breaker opened reaches it open
#: on a loaded machine.
OPEN_MS = 8000


def test_failing_model_opens_the_breaker_and_it_closes_after_healing(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    dep = Deployment.create(
        kafka_bootstrap,
        tmp_path,
        partitions=1,
        PIPELINE_MODEL_FAIL_ON="poison",
        PIPELINE_BREAKER_FAILURES_TO_OPEN="3",
        PIPELINE_BREAKER_OPEN_MS=str(OPEN_MS),
        PIPELINE_RETRY_MAX_ATTEMPTS="1",
    )
    with dep.worker() as worker, RequestProducer(dep.settings) as producer:
        for i in range(3):  # three batches in which every input fails
            producer.send(f"poison pill {i}", lane="standard", request_id=f"poison-{i}")
            producer.flush()
            dep.answers(expect=i + 1)  # answered: the next pill is another batch
        deadline = time.monotonic() + 60
        while "model circuit closed -> open" not in worker.log():
            assert time.monotonic() < deadline, worker.log()[-3000:]
            time.sleep(0.1)
        opened = time.monotonic()
        producer.send(
            "a healthy text while the breaker is open", lane="standard", request_id="while-open"
        )
        producer.flush()
        dep.answers(expect=4)
        # The breaker's timer: past open_ms, the next batch is the half-open probe.
        time.sleep(max(0.0, opened + OPEN_MS / 1000 + 1.0 - time.monotonic()))
        producer.send("a healthy text after the model healed", lane="standard", request_id="after")
        producer.flush()
        answers = {a.record["request_id"]: a for a in dep.answers(expect=5, timeout_s=120)}
        log = worker.log()
    assert all(answers[f"poison-{i}"].kind == "dead_letter" for i in range(3))
    assert answers["while-open"].kind == "dead_letter"
    assert answers["while-open"].record["error_class"] == "CircuitOpenError"
    assert answers["after"].kind == "result"
    moves = re.findall(r"model circuit (\w+) -> (\w+)", log)
    assert ("closed", "open") in moves, moves
    assert moves[-1] == ("half_open", "closed"), moves
