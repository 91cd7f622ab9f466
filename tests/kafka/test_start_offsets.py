"""StartOffsets against a real broker: committed offsets, else the log's start."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from pipeline.settings import Settings
from pipeline.tools.kafka_local import LocalKafka
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
    _commit(kafka_bootstrap, group, TopicPartition(topic, 0, 3))

    base = settings_for()
    settings = base.replace(worker=dataclasses.replace(base.worker, app_id=group))
    starts = StartOffsets(settings)

    async def lookup() -> list[int | None]:
        starts.prefetch([(topic, 0), (topic, 1), (topic, 2)])
        return [await starts.get((topic, p)) for p in range(3)]

    assert asyncio.run(lookup()) == [3, 0, 2]


def _commit(bootstrap: str, group: str, offset: TopicPartition) -> None:
    committer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    for attempt in range(40):  # a fresh broker's group coordinator takes a moment
        try:
            committer.commit(offsets=[offset], asynchronous=False)
            break
        except KafkaException:
            if attempt == 39:
                raise
            time.sleep(0.5)
    committer.close()


@pytest.mark.slow
@pytest.mark.parametrize("idle_s", [0.0, 15.0])
def test_lookups_after_a_broker_restart_find_the_offsets_again(
    make_local_kafka: Callable[[], LocalKafka], idle_s: float
) -> None:
    """The admin client that looked up before a broker restart may never answer again
    (librdkafka 2.16): looking up at once, the log's start failed with
    FENCED_LEADER_EPOCH on every try; 15 s later, the group's offsets timed out on
    every try (the soak's failure: partitions held for over 60 s after its restart).
    A failed lookup drops the client, so a retry asks through a new one: a rebalance
    after the restart (forget, assigned) finds the partitions' starts within a few
    retries, instead of holding them for good."""
    broker = make_local_kafka()
    bootstrap = broker.up()
    topic = f"restart-starts-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(timeout=30)
    group = f"starts-{uuid.uuid4().hex[:8]}"
    _commit(bootstrap, group, TopicPartition(topic, 0, 3))
    base = Settings.from_env()
    settings = base.replace(
        kafka=dataclasses.replace(base.kafka, bootstrap_servers=bootstrap),
        worker=dataclasses.replace(base.worker, app_id=group),
    )
    starts = StartOffsets(settings, timeout_s=3.0, retry_s=0.1, retry_max_s=0.5)
    partitions = [(topic, p) for p in range(3)]

    async def rebalance() -> list[int | None]:
        starts.assigned(partitions)
        return [await asyncio.wait_for(starts.get(tp), 30) for tp in partitions]

    assert asyncio.run(rebalance()) == [3, 0, 0]
    broker.down()
    broker.up()  # same port, same log
    time.sleep(idle_s)
    for tp in partitions:
        starts.forget(tp)
    assert asyncio.run(rebalance()) == [3, 0, 0]
    # Not one retry per partition forever: the second client answered.
    assert starts.failures <= 6, starts.failures


#: A lookup in a process of its own: a segfault there fails the test, not pytest.
_LOOKUP_ALONE = """
import asyncio, dataclasses, json, sys
from pipeline.settings import Settings
from pipeline.worker.start_offsets import StartOffsets
bootstrap, topic, group = sys.argv[1:4]
base = Settings.from_env()
settings = base.replace(
    kafka=dataclasses.replace(base.kafka, bootstrap_servers=bootstrap),
    worker=dataclasses.replace(base.worker, app_id=group),
)
starts = StartOffsets(settings, timeout_s=3.0, retry_s=0.1, retry_max_s=0.5)
partitions = [(topic, p) for p in range(3)]

async def lookup():
    starts.assigned(partitions)
    return [await asyncio.wait_for(starts.get(tp), 60) for tp in partitions]

print(json.dumps(asyncio.run(lookup())))
"""


@pytest.mark.slow
def test_the_first_lookup_on_a_broker_where_no_group_ever_existed_finds_the_log_starts(
    make_local_kafka: Callable[[], LocalKafka],
) -> None:
    """On a broker where no group has existed yet, the group's coordinator answers
    NOT_COORDINATOR while its offsets topic is created and loaded; librdkafka 2.16's
    admin ``list_consumer_group_offsets`` crashed the process on that answer (a
    segfault, every first try). The lookup asks a consumer instead: the answer is an
    error it retries, and then no committed offset, so the logs' starts."""
    broker = make_local_kafka()
    bootstrap = broker.up()
    topic = f"first-starts-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap})
    for _ in range(4):
        producer.produce(topic, value=b"x", partition=2)
    producer.flush(30)
    deleted = TopicPartition(topic, 2, 2)  # partition 2's log starts at 2
    admin.delete_records([deleted])[deleted].result(timeout=30)
    group = f"first-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [sys.executable, "-c", _LOOKUP_ALONE, bootstrap, topic, group],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])  # -11: the segfault
    assert json.loads(done.stdout.splitlines()[-1]) == [0, 0, 2]


def test_an_unreachable_broker_holds_the_partition_until_it_is_revoked(
    settings_for: Callable[..., Settings],
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No start offset, no guess: ``get`` asks again and again, and gives up (None)
    only when the partition is revoked. The lookup's clients say nothing on stderr:
    librdkafka's connection refusals go through logging, as every client's do, each
    lookup handing on what its clients queued."""
    caplog.set_level(logging.DEBUG, logger="librdkafka")
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
    assert "127.0.0.1:1" not in capfd.readouterr().err
    assert any("127.0.0.1:1" in r.getMessage() for r in caplog.records if r.name == "librdkafka")


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
