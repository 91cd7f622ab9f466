"""The event path end to end: real broker, real worker processes, real MiniLM."""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from harness import Deployment
from support.predictions import floats

from pipeline.codecs.avro import MARKER, request_codec
from pipeline.codecs.keys import content_hash
from pipeline.inference import load_model
from pipeline.kafka.client import Answer, RequestProducer, request_bytes

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

TEXTS = [
    "how do I reset my password",
    "shipping to Canada takes how long?",
    "the battery drains overnight even when the phone is idle",
    "refund for a cancelled order",
    "is the blue jacket available in medium",
    "Kafka consumer groups rebalance when a member leaves the group",
    "transformer models batch short texts efficiently",
    "what are your opening hours on Sunday",
    "I was charged twice for the same subscription, please help me get the money back",
    "compare the premium and basic plans",
]


def _cos(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def _by_request(answers: list[Answer]) -> dict[str, list[Answer]]:
    out: dict[str, list[Answer]] = {}
    for a in answers:
        rid = a.record.get("request_id")
        if rid is not None:
            out.setdefault(rid, []).append(a)
    return out


def test_mixed_traffic_every_request_answered_once(kafka_bootstrap: str, tmp_path: Path) -> None:
    dep = Deployment.create(kafka_bootstrap, tmp_path)
    rng = random.Random(7)
    lanes = ["realtime", "standard", "bulk"]
    sent: dict[str, tuple[str, str]] = {}  # request_id -> (text, lane)
    with dep.worker(), RequestProducer(dep.settings) as producer:
        # 42 distinct texts' worth of traffic, about 30 % of it duplicates
        # (exact repeats, whitespace variants, the same text on another lane).
        originals = [f"{t} #{i}" for i, t in enumerate(TEXTS * 3)][:30]
        texts = (
            originals
            + [rng.choice(originals) for _ in range(9)]
            + ["  " + originals[0].replace(" ", "   ") + " "]
        )
        for text in texts:
            lane = rng.choice(lanes)
            rid = producer.send(text, lane=lane)
            sent[rid] = (text, lane)
        # Malformed input: garbage, an unknown schema fingerprint, empty and oversized text.
        producer.send_raw("standard", b"k", b"\x00garbage")
        producer.send_raw("bulk", b"k", MARKER + b"\x13" * 8 + b"\x02x")
        for rid, text in (("empty-1", "   "), ("huge-1", "x" * 9000)):
            _, value = request_bytes(text, request_id=rid)
            producer.send_raw("realtime", b"k", value)
        producer.flush()
        answers = dep.answers(expect=len(sent) + 4)

    by_rid = _by_request(answers)
    results = [a for a in answers if a.kind == "result"]
    letters = [a for a in answers if a.kind == "dead_letter"]
    # every valid request: exactly one result, on its own lane
    for rid, (text, lane) in sent.items():
        got = by_rid.get(rid, [])
        assert len(got) == 1, (rid, got)
        assert got[0].kind == "result"
        assert got[0].record["priority"] == lane
        assert got[0].record["content_hash"] == content_hash(text, dep.settings.model.model_id)
    # malformed: one dead letter each, with the right stage and the bytes untouched
    stages = Counter(a.record["stage"] for a in letters)
    assert stages == {"decode": 2, "validate": 2}, stages
    assert {a.record["request_id"] for a in letters} == {None, "empty-1", "huge-1"}
    assert any(a.record["value"] == b"\x00garbage" for a in letters)
    # dedupe: each distinct content computed once; duplicates say how they were served
    served = Counter(a.record["served"] for a in results)
    distinct = {content_hash(t, dep.settings.model.model_id) for t, _ in sent.values()}
    assert served["computed"] == len(distinct), served
    assert served["batch"] + served["inflight"] + served["stored"] == len(sent) - len(distinct)
    # embeddings equal a direct model call
    model = load_model(dataclasses.replace(dep.settings.model, process="off"))  # here, alone
    sample = results[:12]
    direct = model.predict([sent[a.record["request_id"]][0] for a in sample])
    for a, pred in zip(sample, direct, strict=True):
        assert pred.embedding is not None
        assert _cos(a.record["embedding"], floats(pred)) >= 0.999


def test_lanes_far_over_their_fetch_buffer_pause_and_resume_losing_nothing(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Each lane buffers at most 8 fetched records, so 3,000 requests sent at once
    pause and resume every lane partition in aiokafka (faust_edge.pause_fetch) many
    times over, records fetched before a pause are dropped unread and fetched again:
    every request is answered, once."""
    dep = Deployment.create(
        kafka_bootstrap, tmp_path,
        PIPELINE_MODEL_TASK="noop", PIPELINE_BATCH_STREAM_BUFFER="8",
        PIPELINE_DEGRADE_ENABLED="false",  # late realtime answers would pause bulk for 15 s
    )  # fmt: skip
    lanes = ["realtime", "standard", "bulk"]
    with dep.worker(), RequestProducer(dep.settings) as producer:
        rids = {producer.send(f"request {i}", lane=lanes[i % 3]) for i in range(3000)}
        producer.flush()
        answers = dep.answers(expect=3000, timeout_s=180)
    answered = Counter(a.record.get("request_id") for a in answers)
    assert set(answered) == rids
    assert max(answered.values()) == 1
    assert {a.kind for a in answers} == {"result"}


def test_restart_serves_repeated_text_from_stored_result(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    dep = Deployment.create(kafka_bootstrap, tmp_path, partitions=1)
    text = "a text answered before the restart"
    with dep.worker(), RequestProducer(dep.settings) as producer:
        producer.send(text, lane="standard", request_id="before")
        producer.flush()
        (first,) = dep.answers(expect=1)
    assert first.record["served"] == "computed"
    with dep.worker(), RequestProducer(dep.settings) as producer:
        producer.send(text, lane="bulk", request_id="after")
        producer.flush()
        answers = dep.answers(expect=2)
    after = _by_request(answers)["after"][0].record
    assert after["served"] == "stored"
    assert after["batch_size"] == 0 and after["inference_ms"] == 0.0
    assert after["embedding"] == first.record["embedding"]
    assert after["priority"] == "bulk"


def test_failing_input_is_isolated_retried_and_dead_lettered(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    dep = Deployment.create(
        kafka_bootstrap,
        tmp_path,
        partitions=1,
        PIPELINE_MODEL_FAIL_ON="poison",
        PIPELINE_SCHEDULER_WINDOW_MS="200",
    )
    with dep.worker(), RequestProducer(dep.settings) as producer:
        for i in range(7):
            producer.send(f"healthy text number {i}", lane="bulk", request_id=f"ok-{i}")
        producer.send("this one is poison", lane="bulk", request_id="bad")
        producer.flush()
        answers = dep.answers(expect=8)
    by_rid = _by_request(answers)
    assert all(by_rid[f"ok-{i}"][0].kind == "result" for i in range(7))
    (bad,) = by_rid["bad"]
    assert bad.kind == "dead_letter"
    assert bad.record["stage"] == "infer"
    assert bad.record["attempts"] == dep.settings.retry.max_attempts
    assert bad.record["error_class"] == "InferenceError"
    assert request_codec().decode(bad.record["value"])["text"] == "this one is poison"


def test_two_workers_split_partitions_and_answer_everything(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    dep = Deployment.create(kafka_bootstrap, tmp_path, partitions=4)
    with dep.worker("worker-0"), dep.worker("worker-1"):
        group = dep.settings.worker.app_id
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        desc = admin.describe_consumer_groups([group])[group].result(timeout=30)
        lanes = {dep.settings.topics.lane_topic(lane) for lane in ("realtime", "standard", "bulk")}
        # Changelog partitions are also assigned as standbys; the lanes must be split.
        owned = [
            {(tp.topic, tp.partition) for tp in m.assignment.topic_partitions if tp.topic in lanes}
            for m in desc.members
        ]
        assert len(owned) == 2 and all(owned), owned
        assert not (owned[0] & owned[1])
        assert len(owned[0] | owned[1]) == 3 * 4
        with RequestProducer(dep.settings) as producer:
            rids = {
                producer.send(f"{t} / {i}", lane=("realtime", "standard", "bulk")[i % 3])
                for i, t in enumerate(TEXTS * 4)
            }
            producer.flush()
            answers = dep.answers(expect=len(rids))
    by_rid = _by_request(answers)
    assert set(by_rid) == rids
    assert all(len(v) == 1 and v[0].kind == "result" for v in by_rid.values())
