"""The seek back to committed offsets rewinds every lane partition, committed or not.

Faust's ``perform_seek`` (after records it dropped in a rebalance, and when
recovery ends) calls aiokafka's ``seek_to_committed``, which moves only
partitions with a committed offset above 0. A lane partition the group has
committed nothing for stayed past the dropped records, and its last requests
waited unanswered (the SIGSTOP fault test, once in four runs). The worker's
consumer thread seeks through :func:`pipeline.kafka.faust_edge.seek_to_committed_or_start`
instead; checked here on a real aiokafka consumer against the test broker.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata
from confluent_kafka import Producer

from pipeline.kafka.faust_edge import seek_to_committed_or_start

pytestmark = pytest.mark.kafka

RECORDS = 5


async def _read_to_end(consumer: AIOKafkaConsumer, tps: list[TopicPartition]) -> None:
    for _ in range(200):
        if all([await consumer.position(tp) >= RECORDS for tp in tps]):
            return
        await consumer.getmany(timeout_ms=100)
    raise AssertionError("the consumer did not read every partition to its end")


def test_lane_partitions_without_a_commit_go_back_to_their_first_offset(
    kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    lane, other = topic_factory("lane", partitions=3), topic_factory("other")
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for partition in range(3):
        for _ in range(RECORDS):
            producer.produce(lane, value=b"x", partition=partition)
    for _ in range(RECORDS):
        producer.produce(other, value=b"x", partition=0)
    assert producer.flush(30) == 0
    none, three, zero = (TopicPartition(lane, p) for p in range(3))  # by their commits
    not_a_lane = TopicPartition(other, 0)
    tps = [none, three, zero, not_a_lane]

    async def scenario() -> dict[str, list[int]]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka_bootstrap,
            group_id=f"seek-back-{uuid.uuid4().hex[:8]}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            consumer.assign(tps)
            await consumer.commit({three: OffsetAndMetadata(3, ""), zero: OffsetAndMetadata(0, "")})
            await _read_to_end(consumer, tps)
            await consumer.seek_to_committed()
            aiokafka_alone = [await consumer.position(tp) for tp in tps]
            await _read_to_end(consumer, tps)
            await seek_to_committed_or_start(consumer, frozenset({lane}))
            completed = [await consumer.position(tp) for tp in tps]
            return {"aiokafka alone": aiokafka_alone, "completed": completed}
        finally:
            await consumer.stop()

    positions = asyncio.run(scenario())
    # aiokafka leaves the partitions without a commit above 0 where they were: the cause.
    assert positions["aiokafka alone"] == [RECORDS, 3, RECORDS, RECORDS]
    # Completed: lane partitions read again from their first offset; others left alone.
    assert positions["completed"] == [0, 3, 0, RECORDS]
