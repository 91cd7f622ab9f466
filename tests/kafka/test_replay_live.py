"""``pipeline replay`` against the real broker (kafka): exactly once across a killed run,
the attempts header chain, clear failures, and real dead letters replayed after the
fix. The filters, plans and rate limiting are in tests/unit/tools/test_replay.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from ledger import committed
from support.dead_letters import dead_letter_dict
from support.kafka import end_offsets, read_topic

from pipeline.cli import main
from pipeline.codecs.avro import dead_letter_codec
from pipeline.errors import DecodeError, ExpiredError, InferenceError
from pipeline.kafka.client import RequestProducer, request_bytes
from pipeline.settings import Settings, TopicSettings
from pipeline.tools.replay import (
    ALREADY_SENT,
    ATTEMPT_HEADER,
    ID_HEADER,
    SEND,
    ReplayOptions,
    format_summary,
    replay,
)

# -- against a real broker ----------------------------------------------------------


def _env(settings: Settings) -> dict[str, str]:
    return {
        "PIPELINE_KAFKA_BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "PIPELINE_TOPICS_PREFIX": settings.topics.prefix,
    }


def _produce_dead_letters(
    settings: Settings, count: int, original_topic: str
) -> dict[bytes, bytes]:
    """``count`` dead letters written straight to the dlq; returns their inputs' key: value."""
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers})
    now = int(time.time() * 1000)
    originals = {}
    for i in range(count):
        rid, value = request_bytes(f"text number {i}", request_id=f"dl-{i}")
        record = dead_letter_dict(
            (InferenceError("injected"), ExpiredError("injected"))[i % 2],
            original_topic=original_topic,
            original_offset=i,
            original_timestamp_ms=now,
            key=f"key-{i}".encode(),
            value=value,
            failed_at_ms=now,
            request_id=rid,
        )
        key = f"key-{i}".encode()
        value_bytes = dead_letter_codec().encode(record)
        producer.produce(settings.topics.dlq_topic, key=key, value=value_bytes)
        originals[key] = value
    assert producer.flush(30) == 0
    return originals


def _headers(msg: Any) -> dict[str, str]:
    return {k: v.decode() for k, v in (msg.headers() or [])}


@pytest.mark.kafka
def test_killed_replay_run_again_sends_each_record_exactly_once(
    unique_topics: TopicSettings, settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = settings_for(topics=unique_topics)
    dest = unique_topics.lane_topic("bulk")
    # The dead letters claim inputs at (dest, 0, 0..39), where the replayed records
    # will land too: attempts must still be 1 (lineage matches bytes, not only positions).
    originals = _produce_dead_letters(settings, 40, dest)
    bootstrap = settings.kafka.bootstrap_servers
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env.update(_env(settings))
    exe = str(Path(sys.executable).with_name("pipeline"))
    with open(tmp_path / "replay.log", "wb") as log:
        proc = subprocess.Popen(
            # 2 a second: the 40 take 20 s, so the kill surely lands mid-run
            # however slowly this loop notices the first 10.
            [exe, "replay-dlq", "--rate", "2", "--group", "killed"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while sum(end_offsets(bootstrap, [dest]).values()) < 10:
                assert proc.poll() is None, (tmp_path / "replay.log").read_text()
                assert time.monotonic() < deadline
                time.sleep(0.2)
            proc.send_signal(signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
    sent_before = sum(end_offsets(bootstrap, [dest]).values())
    assert 10 <= sent_before < 40, sent_before

    result = CliRunner().invoke(main, ["replay-dlq", "--group", "killed"], env=_env(settings))
    assert result.exit_code == 0, result.output
    assert f"already sent {sent_before}" in result.output, result.output

    replayed = read_topic(bootstrap, dest)
    ids = Counter(_headers(m)[ID_HEADER] for m in replayed)
    assert len(ids) == 40 and set(ids.values()) == {1}, ids
    assert {_headers(m)[ATTEMPT_HEADER] for m in replayed} == {"1"}
    # the original key and value bytes, untouched
    assert {(m.key(), m.value()) for m in replayed} == set(originals.items())
    # the group committed the whole range, only after the acknowledgements
    dlq = unique_topics.dlq_topic
    assert committed(bootstrap, "killed", [dlq]) == end_offsets(bootstrap, [dlq])

    # a third run finds everything sent; --dry-run --force would send all 40 again
    again = replay(settings, ReplayOptions(group="killed", progress=False))
    assert again.outcomes[ALREADY_SENT] == 40 and again.acked == 0
    forced = replay(settings, ReplayOptions(dry_run=True, force=True, progress=False))
    assert forced.outcomes[SEND] == 40


@pytest.mark.kafka
def test_attempts_follow_the_header_chain_and_stop_at_max_attempts(
    unique_topics: TopicSettings, settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = settings_for(topics=unique_topics)
    lane = unique_topics.lane_topic("standard")
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers})
    where: dict[str, tuple[int, int]] = {}

    def record_offset(name: str) -> Callable[[Any, Any], None]:
        def done(err: Any, msg: Any) -> None:
            assert err is None
            where[name] = (msg.partition(), msg.offset())

        return done

    # two earlier replays as a worker would have consumed them: attempts 2 and 5
    for name, attempt in (("second", "2"), ("fifth", "5")):
        producer.produce(
            lane,
            key=name.encode(),
            value=b"\x00bad",
            partition=0,
            headers=[(ID_HEADER, f"old/0/{name}"), (ATTEMPT_HEADER, attempt)],
            on_delivery=record_offset(name),
        )
    assert producer.flush(30) == 0
    now = int(time.time() * 1000)
    for name, (partition, offset) in where.items():
        record = dead_letter_dict(
            DecodeError("not avro"),
            original_topic=lane,
            original_partition=partition,
            original_offset=offset,
            original_timestamp_ms=now,
            key=name.encode(),
            value=b"\x00bad",
            failed_at_ms=now,
        )
        producer.produce(unique_topics.dlq_topic, value=dead_letter_codec().encode(record))
    assert producer.flush(30) == 0

    export = tmp_path / "selected.jsonl"
    runner = CliRunner()
    result = runner.invoke(main, ["replay-dlq", "--export", str(export)], env=_env(settings))
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in export.read_text().splitlines()]
    assert sorted(r["replay_attempts"] for r in rows) == [2, 5]
    assert sum(end_offsets(settings.kafka.bootstrap_servers, [lane]).values()) == 2

    result = runner.invoke(main, ["replay-dlq", "--max-attempts", "5"], env=_env(settings))
    assert result.exit_code == 0, result.output
    assert "over max attempts 1" in result.output and "replayed 1" in result.output
    replayed = [
        m
        for m in read_topic(settings.kafka.bootstrap_servers, lane)
        if not _headers(m)[ID_HEADER].startswith("old/")
    ]
    assert len(replayed) == 1
    assert replayed[0].key() == b"second"
    assert _headers(replayed[0])[ATTEMPT_HEADER] == "3"


@pytest.mark.kafka
def test_missing_topics_and_unreachable_broker_fail_clearly(
    unique_topics: TopicSettings, settings_for: Callable[..., Settings]
) -> None:
    settings = settings_for(topics=unique_topics)
    runner = CliRunner()
    env = _env(settings)
    result = runner.invoke(main, ["replay-dlq", "--dlq", "no.such.dlq"], env=env)
    assert result.exit_code == 1
    assert "ConfigurationError: dead-letter topic 'no.such.dlq' does not exist" in result.output
    result = runner.invoke(main, ["replay-dlq", "--to", "no.such.topic"], env=env)
    assert result.exit_code == 1
    # --to is under the deployment's prefix, and the error names the prefixed topic.
    assert f"topic '{unique_topics.prefix}no.such.topic' does not exist" in result.output
    # a dead letter whose original topic was deleted: dry-run reports it, a replay refuses
    _produce_dead_letters(settings, 1, "gone.topic")
    result = runner.invoke(main, ["replay-dlq", "--dry-run"], env=env)
    assert result.exit_code == 0 and "missing original topic(s): gone.topic" in result.output
    result = runner.invoke(main, ["replay-dlq"], env=env)
    assert result.exit_code == 1 and "gone.topic do not exist" in result.output

    result = runner.invoke(
        main, ["replay-dlq", "-b", "127.0.0.1:1", "--connect-timeout", "2"], env=env
    )
    assert result.exit_code == 1
    # It gave up after the connect timeout it was given.
    assert "BrokerUnavailable: no broker answered at 127.0.0.1:1 within 2 s" in result.output
    assert "Traceback" not in result.output


@pytest.mark.kafka
@pytest.mark.slow
def test_real_dead_letters_dry_run_then_replay_after_the_fix(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    from harness import Deployment

    dep = Deployment.create(
        kafka_bootstrap,
        tmp_path,
        partitions=1,
        PIPELINE_MODEL_FAIL_ON="poison",
    )
    with dep.worker(), RequestProducer(dep.settings) as producer:
        for i in range(3):
            producer.send(f"healthy text {i}", lane="bulk", request_id=f"ok-{i}")
        producer.send("poison number one", lane="bulk", request_id="bad-1")
        producer.send("poison number two", lane="standard", request_id="bad-2")
        producer.send_raw("standard", b"k", b"\x00garbage")
        _, empty = request_bytes("   ", request_id="empty-1")
        producer.send_raw("realtime", b"k", empty)
        producer.flush()
        answers = dep.answers(expect=7)
    letters = [a for a in answers if a.kind == "dead_letter"]
    assert len(letters) == 4
    made = Counter(
        (a.record["stage"], a.record["error_class"], a.record["original_topic"]) for a in letters
    )
    topics = dep.settings.topics
    watched = [
        *(topics.lane_topic(x) for x in ("realtime", "standard", "bulk")),
        topics.results_topic,
        topics.dlq_topic,
    ]
    before = end_offsets(kafka_bootstrap, watched)

    runner = CliRunner()
    result = runner.invoke(main, ["replay-dlq", "--dry-run"], env=dep.env)
    assert result.exit_code == 0, result.output
    assert format_summary(made) in result.stdout
    assert "would replay 4" in result.stdout
    assert end_offsets(kafka_bootstrap, watched) == before  # produced nothing

    with dep.worker(PIPELINE_MODEL_FAIL_ON=""):
        result = runner.invoke(main, ["replay-dlq", "--stage", "infer"], env=dep.env)
        assert result.exit_code == 0, result.output
        assert "replayed 2" in result.output
        answers = dep.answers(expect=9)
    fixed = {
        a.record["request_id"]: a
        for a in answers
        if a.kind == "result" and a.record["request_id"] in {"bad-1", "bad-2"}
    }
    assert set(fixed) == {"bad-1", "bad-2"}
    assert all(a.kind == "result" and a.record["served"] == "computed" for a in fixed.values())
    assert fixed["bad-1"].record["priority"] == "bulk"
    assert fixed["bad-2"].record["priority"] == "standard"
    # the same replay again sends nothing
    result = runner.invoke(main, ["replay-dlq", "--stage", "infer"], env=dep.env)
    assert result.exit_code == 0 and "already sent 2" in result.output, result.output
