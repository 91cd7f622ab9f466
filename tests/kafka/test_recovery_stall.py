"""A recovery of the stored results that never completes by itself is let go
(faust_edge/recovery_watch.py).

A real broker and real worker processes (the ``noop`` model). Faust's recovery
waits for a record at the highwater it read at the rebalance, the log end less
one; unless the app processes exactly once, it never passes over an offset
without a record. So a changelog partition whose last offset is a transaction's
marker holds the recovery, and with it the partition's lanes, for good: made
here by writing one entry into the dedupe changelog in a committed transaction.
(The worker itself writes the changelog without transactions; the marker is the
reproducible way to a recovery that receives nothing, as one did in a fault
test, see docs/design.md, "A stalled recovery".)

A new worker then recovers that partition at start. The watch reads it again
twice, ``PIPELINE_DEDUPE_RECOVERY_STALL_S`` apart, then lets it go: the worker
gets ready and answers. The log names each step, and the metric counts them.
With the watch disabled by a stall limit longer than the test, the same worker
never got ready (checked by hand: 180 s).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from confluent_kafka import Producer
from harness import Deployment
from support.scrape import counter_by

from pipeline.kafka.client import RequestProducer
from pipeline.kafka.security import client_config
from pipeline.tools.supervise import free_port
from pipeline.worker.dedupe import TABLE_NAME

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(300)]

READ_AGAIN = re.compile(
    r"dedupe changelog (\S+)\[0\]: recovery received nothing for \d+ s \(at offset 1 of 2, "
    r"the consumer at (\S+)\); reading it again from 1"
)
LET_GO = re.compile(
    r"dedupe changelog (\S+)\[0\]: recovery received nothing after 2 readings .*; let go: "
    r"the results of offsets 2\.\.2 are not restored"
)


def _entry_in_a_transaction(dep: Deployment, topic: str) -> None:
    """One dedupe entry written to partition 0 of ``topic`` in a committed transaction:
    its marker is the partition's last offset."""
    producer = Producer(
        {
            **client_config(dep.settings),
            "transactional.id": f"{dep.settings.topics.prefix}recovery-stall",
            "acks": "all",
        }
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic, key=b"written-in-a-transaction", value=b"not a result", partition=0)
    producer.commit_transaction(30)
    assert producer.flush(10) == 0
    del producer  # destroyed here, in the test's thread


def test_a_recovery_that_receives_nothing_is_read_again_then_let_go(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    dep = Deployment.create(
        kafka_bootstrap,
        tmp_path,
        partitions=1,
        PIPELINE_MODEL_TASK="noop",
        PIPELINE_DEDUPE_RECOVERY_STALL_S="2",
    )
    changelog = f"{dep.settings.worker.app_id}-{TABLE_NAME}-changelog"
    # A first worker makes the changelog and stores one result in it (offset 0).
    with dep.worker("worker-0"), RequestProducer(dep.settings) as producer:
        producer.send("a first request", lane="standard", request_id="first")
        assert [a.request_id for a in dep.answers(expect=1, timeout_s=60)] == ["first"]
    _entry_in_a_transaction(dep, changelog)  # the entry at offset 1, its marker at 2

    port = free_port()
    # A new worker (its own empty store) recovers offsets 0..2: it gets ready only if
    # the recovery is let go.
    with dep.worker("worker-1", PIPELINE_METRICS_PORT=str(port)) as worker:
        with RequestProducer(dep.settings) as producer:
            producer.send("a second request", lane="standard", request_id="second")
        answers = dep.answers(expect=2, timeout_s=60)
        assert sorted(str(a.request_id) for a in answers) == ["first", "second"]
        stalls = counter_by(port, "pipeline_dedupe_recovery_stalls_total", "action")
        log = worker.log()

    read_again = READ_AGAIN.findall(log)
    assert [topic for topic, _at in read_again] == [changelog, changelog], log[-4000:]
    assert all(at == "3" for _topic, at in read_again), read_again  # past the marker
    assert [topic for topic in LET_GO.findall(log)] == [changelog], log[-4000:]
    assert stalls == {"read-again": 2, "let-go": 1}, stalls
