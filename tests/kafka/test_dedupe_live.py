"""The dedupe store on a real broker with real worker processes: a stored answer is
served only for the same model input, of the same model files (README, "Dedupe")."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)
from harness import Deployment
from support.predictions import floats
from tiny_model import build_tiny_bert

from pipeline.codecs.avro import request_codec
from pipeline.codecs.keys import content_hash
from pipeline.inference import load_model
from pipeline.kafka.client import Answer, RequestProducer
from pipeline.kafka.security import client_config
from pipeline.kafka.topics import create_topics
from pipeline.worker.dedupe import changelog_topic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _cos(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def _send_and_wait(dep: Deployment, text: str, rid: str, expect: int) -> dict[str, Answer]:
    """Send one request and return every answer so far by request id, once ``expect`` are in."""
    with RequestProducer(dep.settings) as producer:
        producer.send(text, lane="standard", request_id=rid)
        producer.flush()
    answers = dep.answers(expect=expect)
    return {str(a.record["request_id"]): a for a in answers}


def test_a_text_the_tokenizer_reads_differently_is_computed_not_served_stored(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    # U+001F is whitespace to Python's str.split / \s, but BERT's normaliser deletes it:
    # the model sees "alphabeta gamma delta" for the first text, four words for the second.
    dep = Deployment.create(kafka_bootstrap, tmp_path, partitions=1)
    with dep.worker():
        _send_and_wait(dep, "alpha\x1fbeta gamma delta", "fused", 1)
        got = _send_and_wait(dep, "alpha beta gamma delta", "spaced", 2)
        # What the tokenizer does guarantee equal still shares: case, whitespace runs.
        got = _send_and_wait(dep, "  ALPHA beta\tgamma   delta ", "variant", 3)
    spaced, variant = got["spaced"].record, got["variant"].record
    assert spaced["served"] == "computed", spaced["served"]
    model = load_model(dataclasses.replace(dep.settings.model, process="off"))  # here, alone
    (direct,) = model.predict(["alpha beta gamma delta"])
    assert direct.embedding is not None
    assert _cos(spaced["embedding"], floats(direct)) >= 0.999
    assert variant["served"] == "stored", variant["served"]
    assert variant["embedding"] == spaced["embedding"]


def test_new_weights_at_the_same_path_are_computed_not_served_stored(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    # Same folder, same name@version, same task: only the weights change between runs.
    folder = build_tiny_bert(tmp_path / "model", seed=0)
    dep = Deployment.create(
        kafka_bootstrap, tmp_path, partitions=1, PIPELINE_MODEL_PATH=str(folder)
    )
    with dep.worker():
        before = _send_and_wait(dep, "good movie", "old-weights", 1)["old-weights"].record
    build_tiny_bert(folder, seed=1)
    with dep.worker():
        _send_and_wait(dep, "good movie", "new-weights", 2)
        got = _send_and_wait(dep, "good movie", "new-again", 3)
    after, again = got["new-weights"].record, got["new-again"].record
    assert before["served"] == "computed"
    assert after["served"] == "computed", after["served"]
    assert after["embedding"] != before["embedding"]
    assert again["served"] == "stored" and again["embedding"] == after["embedding"]


def _cleanup(admin: AdminClient, topic: str, want: dict[str, str]) -> dict[str, str]:
    """The topic's cleanup settings once they read ``want`` (the broker shows a new topic,
    and a changed setting, a moment after the call), or as they are after a minute."""
    resource = ConfigResource("topic", topic)
    deadline = time.monotonic() + 60
    while True:
        try:
            configs = admin.describe_configs([resource])[resource].result(30)
            have = {k: configs[k].value for k in want}
        except KafkaException:  # not known to the broker yet
            have = {}
        if have == want or time.monotonic() > deadline:
            return have
        time.sleep(0.2)


def test_the_dedupe_changelog_is_compacted_and_pruned_past_the_ttl(
    kafka_bootstrap: str, kafka_admin: AdminClient, tmp_path: Path
) -> None:
    dep = Deployment.create(kafka_bootstrap, tmp_path, partitions=2, PIPELINE_DEDUPE_TTL_S="3600")
    changelog = changelog_topic(dep.settings.worker.app_id)
    pruned = {"cleanup.policy": "compact,delete", "retention.ms": "3600000"}
    # `topics create` made it, with the lanes' partition count
    assert _cleanup(kafka_admin, changelog, pruned) == pruned
    assert len(kafka_admin.list_topics(changelog, timeout=30).topics[changelog].partitions) == 2
    # a changelog made before (compacted, kept forever) is brought in line by it
    kept = ConfigResource(
        "topic",
        changelog,
        incremental_configs=[
            ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
        ],
    )
    kafka_admin.incremental_alter_configs([kept])[kept].result(30)
    kept_forever = {"cleanup.policy": "compact", "retention.ms": "604800000"}
    assert _cleanup(kafka_admin, changelog, kept_forever) == kept_forever
    assert create_topics(dep.settings)[changelog] == "aligned"
    assert _cleanup(kafka_admin, changelog, pruned) == pruned
    assert create_topics(dep.settings)[changelog] == "exists"
    # where the topic is missing (another app id), the worker's Faust table creates it
    app_id = f"{dep.settings.worker.app_id}-b"
    own = changelog_topic(app_id)
    assert own not in kafka_admin.list_topics(timeout=30).topics
    with dep.worker(PIPELINE_WORKER_APP_ID=app_id):
        assert _cleanup(kafka_admin, own, pruned) == pruned


def _lane_records(dep: Deployment, lane: str, expect: int) -> list[tuple[bytes, bytes]]:
    """The first ``expect`` records of a lane topic, as (key, value)."""
    consumer = Consumer(
        {**client_config(dep.settings), "group.id": "-", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([dep.settings.topics.lane_topic(lane)])
    got: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < expect and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                key, value = msg.key(), msg.value()
                assert key is not None and value is not None
                got.append((key, value))
    finally:
        consumer.close()
    return got


def test_a_worker_taking_over_serves_what_another_stored_restored_from_the_changelog(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    dep = Deployment.create(kafka_bootstrap, tmp_path, partitions=2)
    texts = [f"stored before the failover, text {i}" for i in range(6)]
    with dep.worker("worker-0"), RequestProducer(dep.settings) as producer:
        for i, text in enumerate(texts):
            producer.send(text, lane="bulk", request_id=f"first-{i}")
        producer.flush()
        first = dep.answers(expect=len(texts))
    assert {a.record["served"] for a in first} == {"computed"}
    # The request key is the content hash (it partitions; the worker dedupes stricter).
    records = _lane_records(dep, "bulk", len(texts))
    model_id = dep.settings.model.model_id
    for key, value in records:
        assert key == content_hash(request_codec().decode(value)["text"], model_id).encode()
    # A worker with an empty RocksDB folder restores the table from the changelog.
    with dep.worker("worker-1"), RequestProducer(dep.settings) as producer:
        for i, text in enumerate(texts):
            producer.send(text.upper(), lane="standard", request_id=f"again-{i}")
        producer.flush()
        answers = dep.answers(expect=2 * len(texts))
    again = {a.record["request_id"]: a.record for a in answers}
    before = {a.record["request_id"]: a.record for a in first}
    for i, text in enumerate(texts):
        got = again[f"again-{i}"]
        assert got["served"] == "stored", (i, got["served"])
        assert got["embedding"] == before[f"first-{i}"]["embedding"]
        assert got["content_hash"] == content_hash(text.upper(), model_id)


def test_two_workers_of_one_group_compute_a_repeated_text_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    dep = Deployment.create(kafka_bootstrap, tmp_path, partitions=2)
    texts = [f"asked again and again, text {i}" for i in range(4)]
    with dep.worker("worker-0"), dep.worker("worker-1"):
        with RequestProducer(dep.settings) as producer:
            for i, text in enumerate(texts):
                producer.send(text, lane="standard", request_id=f"a-{i}")
            producer.flush()
        dep.answers(expect=len(texts))
        with RequestProducer(dep.settings) as producer:
            for i, text in enumerate(texts):
                producer.send(text, lane="realtime", request_id=f"b-{i}")
            producer.flush()
        answers = dep.answers(expect=2 * len(texts))
    served = {a.record["request_id"]: a.record["served"] for a in answers}
    assert [served[f"a-{i}"] for i in range(4)] == ["computed"] * 4
    assert [served[f"b-{i}"] for i in range(4)] == ["stored"] * 4
