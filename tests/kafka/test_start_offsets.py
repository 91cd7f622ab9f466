"""StartOffsets against a real broker: committed offsets, else the log's start."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from pipeline.settings import Settings
from pipeline.worker.start_offsets import StartOffsets

pytestmark = pytest.mark.kafka


def test_committed_offset_else_log_start_in_one_lookup(
    kafka_bootstrap: str,
    kafka_admin: AdminClient,
    topic_factory: Callable[..., str],
    settings_for: Callable[..., Settings],
) -> None:
    topic = topic_factory("starts", partitions=3)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(12):
        producer.produce(topic, value=b"x", partition=i % 3)
    producer.flush(30)
    # Records 0..1 of partition 2 are deleted: its log starts at 2.
    kafka_admin.delete_records([TopicPartition(topic, 2, 2)])[TopicPartition(topic, 2, 2)].result(
        timeout=30
    )
    group = f"starts-{uuid.uuid4().hex[:8]}"
    committer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group})
    for attempt in range(40):  # a fresh broker's group coordinator takes a moment
        try:
            committer.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
            break
        except KafkaException:
            if attempt == 39:
                raise
            time.sleep(0.5)
    committer.close()

    base = settings_for()
    settings = base.replace(worker=dataclasses.replace(base.worker, app_id=group))
    starts = StartOffsets(settings)

    async def lookup() -> list[int | None]:
        starts.prefetch([(topic, 0), (topic, 1), (topic, 2)])
        return [await starts.get((topic, p)) for p in range(3)]

    assert asyncio.run(lookup()) == [3, 0, 2]


def test_an_unreachable_broker_holds_the_partition_until_it_is_revoked(
    settings_for: Callable[..., Settings],
) -> None:
    """No start offset, no guess: ``get`` asks again and again, and gives up (None)
    only when the partition is revoked."""
    base = settings_for()
    settings = base.replace(kafka=dataclasses.replace(base.kafka, bootstrap_servers="127.0.0.1:1"))
    starts = StartOffsets(settings, timeout_s=0.5, retry_s=0.05, retry_max_s=0.1)

    async def scenario() -> tuple[bool, int | None]:
        waiting = asyncio.ensure_future(starts.get(("nowhere", 0)))
        while starts.failures < 2:  # noqa: ASYNC110  (a counter, polled: two lookups failed)
            await asyncio.sleep(0.05)
        held = not waiting.done()
        starts.forget(("nowhere", 0))
        return held, await asyncio.wait_for(waiting, 30)

    assert asyncio.run(scenario()) == (True, None)


def test_a_failed_lookup_is_retried_until_the_broker_tells() -> None:
    calls: list[list[tuple[str, int]]] = []

    def flaky(todo: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        calls.append(todo)
        if len(calls) < 3:
            raise RuntimeError("coordinator not available")
        return dict.fromkeys(todo, 42)

    starts = StartOffsets(Settings.from_env(), lookup=flaky, retry_s=0.01, retry_max_s=0.02)
    assert asyncio.run(starts.get(("lane", 1))) == 42
    assert len(calls) == 3 and starts.failures == 2


def test_a_revoked_partition_is_not_looked_up_until_it_is_assigned_again() -> None:
    """A record fetched before a revoke and read after it must not start a lookup
    (its start would be tracked into the next assignment)."""
    calls: list[list[tuple[str, int]]] = []

    def lookup(todo: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        calls.append(todo)
        return dict.fromkeys(todo, 7)

    starts = StartOffsets(Settings.from_env(), lookup=lookup)

    async def scenario() -> list[int | None]:
        starts.assigned([("lane", 0)])
        first = await starts.get(("lane", 0))
        starts.forget(("lane", 0))
        stale = await starts.get(("lane", 0))
        starts.assigned([("lane", 0)])
        return [first, stale, await starts.get(("lane", 0))]

    assert asyncio.run(scenario()) == [7, None, 7]
    assert calls == [[("lane", 0)], [("lane", 0)]]
