"""Reading a topic back in a test: its records up to the end, and its end offsets."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

__all__ = ["end_offsets", "read_topic"]


def read_topic(bootstrap: str, topic: str, timeout_s: float = 30.0) -> list[Any]:
    """Every record of ``topic`` (from offset 0) up to its end as it is now, with
    headers; AssertionError when they are not all read within ``timeout_s``."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in parts}
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < sum(ends.values()) and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                assert msg.error() is None, msg.error()
                out.append(msg)
        assert len(out) == sum(ends.values()), (len(out), ends)
        return out
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topics: list[str]) -> dict[tuple[str, int], int]:
    """The end offset of every partition of ``topics`` (waits for a new topic's leader)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "test-ends"})
    try:
        out = {}
        for topic in topics:
            for p in consumer.list_topics(topic, timeout=10).topics[topic].partitions:
                for _ in range(20):  # a new topic's leader may not be known yet
                    try:
                        out[(topic, p)] = consumer.get_watermark_offsets(
                            TopicPartition(topic, p), 10
                        )[1]
                        break
                    except KafkaException:
                        time.sleep(0.25)
                else:
                    raise AssertionError(f"no end offset for {topic}/{p}")
        return out
    finally:
        consumer.close()
