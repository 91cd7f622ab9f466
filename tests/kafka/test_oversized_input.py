"""One lane record near the broker's size limit must not stop its lane (README, "Guarantees").

A real broker and a real worker process: a lane record of 1,040,000 random
bytes (the broker accepts it; a dead letter copying it whole would pass the
producer's request limit) becomes a dead letter whose copy of the value is a
bounded prefix plus the original length and sha256; the partition's committed
offset moves past it and past the valid request behind it; SIGTERM stops the
worker cleanly (the harness fails a worker that needs SIGKILL). ``replay-dlq``
then re-reads the full value from the lane topic by its coordinates, and says
so when the lane no longer holds it.
"""

from __future__ import annotations

import hashlib
import random
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from harness import Deployment

from pipeline.kafka.client import RequestProducer
from pipeline.kafka.security import client_config
from pipeline.settings import Settings
from pipeline.tools.replay import ReplayOptions, replay
from pipeline.worker.publish import DEAD_LETTER_VALUE_PREFIX

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SIZE = 1_040_000


def _produce_raw(settings: Settings, topic: str, value: bytes) -> int:
    """Produce one record of ``value`` to partition 0 of ``topic``; return its offset."""
    producer = Producer({**client_config(settings), "message.max.bytes": 2_000_000})
    offsets: list[int] = []

    def on_delivery(err: object, msg: object) -> None:
        assert err is None, err
        offsets.append(msg.offset())  # type: ignore[attr-defined]

    producer.produce(topic, value=value, key=b"big", partition=0, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    return offsets[0]


def _committed(settings: Settings, topic: str) -> int:
    consumer = Consumer({**client_config(settings), "group.id": settings.worker.app_id})
    try:
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        return int(tp.offset)
    finally:
        consumer.close()


def _wait_committed(settings: Settings, topic: str, at_least: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    seen = _committed(settings, topic)
    while seen < at_least and time.monotonic() < deadline:
        time.sleep(0.5)
        seen = _committed(settings, topic)
    return seen


def test_a_record_of_1_040_000_bytes_is_dead_lettered_and_the_lane_moves_on(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    dep = Deployment.create(kafka_bootstrap, tmp_path, partitions=1)
    lane = dep.settings.topics.lane_topic("bulk")
    big = random.Random(13).randbytes(SIZE)
    with dep.worker():
        big_offset = _produce_raw(dep.settings, lane, big)
        with RequestProducer(dep.settings) as producer:
            producer.send("the request behind the big record", lane="bulk", request_id="after")
            producer.flush()
        answers = dep.answers(expect=2, timeout_s=90)
        committed = _wait_committed(dep.settings, lane, big_offset + 2, timeout_s=60)
    assert committed == big_offset + 2, "the lane's committed offset must move past the record"
    kinds = {a.kind: a for a in answers}
    assert kinds["result"].record["request_id"] == "after"
    dead = kinds["dead_letter"]
    letter = dead.record
    assert (letter["original_topic"], letter["original_offset"]) == (lane, big_offset)
    assert letter["stage"] in {"decode", "validate"}  # random bytes, over the payload limit
    assert letter["value"] == big[:DEAD_LETTER_VALUE_PREFIX]
    assert letter["value_length"] == SIZE
    assert letter["value_sha256"] == hashlib.sha256(big).hexdigest()

    # replay-dlq re-reads the whole value from the lane topic while it is retained.
    dest = dep.settings.topics.prefix + "replayed"
    admin = AdminClient(client_config(dep.settings))
    admin.create_topics([NewTopic(dest, 1, 1)])[dest].result(30)
    report = replay(dep.settings, ReplayOptions(to_topic=dest, progress=False))
    assert report.acked == 1 and report.refetched == 1
    reader = Consumer(
        {**client_config(dep.settings), "group.id": "check", "auto.offset.reset": "earliest"}
    )
    reader.assign([TopicPartition(dest, 0, 0)])
    msg = None
    for _ in range(100):
        msg = reader.poll(0.5)
        if msg is not None and msg.error() is None:
            break
    reader.close()
    assert msg is not None and msg.value() == big

    # Once the lane no longer holds it, replay says so and sends nothing.
    futures = admin.delete_records([TopicPartition(lane, 0, big_offset + 1)])
    for f in futures.values():
        f.result(30)
    gone = replay(dep.settings, ReplayOptions(to_topic=dest, progress=False, force=True))
    assert gone.acked == 0
    assert gone.gone == [f"{dead.topic}/{dead.partition}/{dead.offset}"]
