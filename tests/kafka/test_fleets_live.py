"""Lane-dedicated fleets (PIPELINE_WORKER_LANES) on the real broker: a realtime fleet
answers realtime and leaves bulk to a bulk fleet in its own consumer group."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from harness import Deployment

from pipeline.kafka.client import RequestProducer

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _committed(bootstrap: str, group: str, topic: str) -> int:
    """The group's committed offset on partition 0 of ``topic`` (< 0: none)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        return int(tp.offset)
    finally:
        consumer.close()


def test_a_realtime_fleet_leaves_bulk_to_a_bulk_fleet_of_its_own(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    dep = Deployment.create(kafka_bootstrap, tmp_path, partitions=1)
    topics = dep.settings.topics
    realtime_group = dep.settings.worker.app_id + "-realtime"
    bulk_group = dep.settings.worker.app_id + "-bulk"
    tag = uuid.uuid4().hex[:6]
    with RequestProducer(dep.settings) as producer:
        bulk = {producer.send(f"bulk report {i} {tag}", lane="bulk") for i in range(5)}
        realtime = {producer.send(f"urgent question {i} {tag}", lane="realtime") for i in range(5)}
        producer.flush()

    with dep.worker(PIPELINE_WORKER_LANES="realtime", PIPELINE_WORKER_APP_ID=realtime_group):
        answered = {a.record["request_id"] for a in dep.answers(expect=5, timeout_s=120)}
        assert answered == realtime
        # Its consumer group commits what it consumed (realtime) and never touches bulk.
        deadline = time.monotonic() + 60
        while _committed(kafka_bootstrap, realtime_group, topics.lane_topic("realtime")) < 5:
            assert time.monotonic() < deadline, "the realtime fleet never committed realtime"
            time.sleep(0.5)
        assert _committed(kafka_bootstrap, realtime_group, topics.lane_topic("bulk")) < 0

    with dep.worker(
        "worker-1", PIPELINE_WORKER_LANES="standard,bulk", PIPELINE_WORKER_APP_ID=bulk_group
    ):
        answers = dep.answers(expect=10, timeout_s=120)
    by_id = Counter(a.record["request_id"] for a in answers)
    assert set(by_id) == realtime | bulk
    assert set(by_id.values()) == {1}  # realtime was not answered again by the bulk fleet
    assert all(a.kind == "result" for a in answers)
    assert _committed(kafka_bootstrap, bulk_group, topics.lane_topic("realtime")) < 0
