"""Errors a person can act on: one line, exit status 1, no traceback, nothing half-sent.

The address checks run the real console command in a subprocess, because
librdkafka writes its own log lines straight to the process's stderr unless
they are routed through Python logging; CliRunner would not see them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from conftest import free_ports

from pipeline.cli import main
from pipeline.codecs.avro import request_codec
from pipeline.settings import Settings, TopicSettings

PIPELINE = [sys.executable, "-c", "from pipeline.cli import main; main()"]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}


def _run(args: list[str], env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PIPELINE, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={**_clean_env(), **env},
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "stdin"),
    [
        (["produce", "--lane", "bulk"], "a text\nanother\n"),
        (["topics", "create"], ""),
        (["topics", "list"], ""),
        (["answers"], ""),
    ],
)
def test_no_broker_at_the_address_is_one_line(args: list[str], stdin: str) -> None:
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    done = _run(args, {"PIPELINE_KAFKA_BOOTSTRAP_SERVERS": address}, stdin)
    assert done.returncode == 1, done
    assert done.stdout == ""  # no request id printed as if sent
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # no librdkafka "%3|...|FAIL|" lines
    assert lines[0].startswith("Error: BrokerUnavailable: no broker answered")
    assert address in lines[0]
    assert "PIPELINE_KAFKA_BOOTSTRAP_SERVERS" in lines[0]


@pytest.mark.parametrize("args", [["produce"], ["topics", "create"], ["topics", "describe"]])
def test_empty_bootstrap_names_the_setting(args: list[str]) -> None:
    result = CliRunner().invoke(
        main, args, env={"PIPELINE_KAFKA_BOOTSTRAP_SERVERS": " "}, input="x"
    )
    assert result.exit_code == 1
    assert result.output.strip() == (
        "Error: ConfigurationError: PIPELINE_KAFKA_BOOTSTRAP_SERVERS is empty; "
        "set it to the brokers' host:port[,...]"
    )


@pytest.mark.kafka
def test_produce_refuses_missing_lane_topics_and_creates_none(kafka_bootstrap: str) -> None:
    prefix = f"typo{uuid.uuid4().hex[:8]}."
    env = {"PIPELINE_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "PIPELINE_TOPICS_PREFIX": prefix}
    done = _run(["produce", "--lane", "bulk"], env, "hello\n")
    assert done.returncode == 1, done
    assert done.stdout == ""
    lanes = ", ".join(TopicSettings(prefix=prefix).all_topics()[:3])
    assert done.stderr.strip().splitlines() == [
        f"Error: ConfigurationError: lane topic(s) {lanes} do not exist at {kafka_bootstrap}; "
        "create them with `pipeline topics create`, or check PIPELINE_TOPICS_PREFIX "
        f"({prefix!r})"
    ]
    topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert not [t for t in topics if t.startswith(prefix)]


def _lane_values(bootstrap: str, topic: str) -> list[dict[str, object]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "-"})
    try:
        part = TopicPartition(topic, 0)
        _low, high = consumer.get_watermark_offsets(part, timeout=10)
        consumer.assign([TopicPartition(topic, 0, 0)])
        out: list[dict[str, Any]] = []
        while len(out) < high:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                out.append(request_codec().decode(msg.value()))
        return out
    finally:
        consumer.close()


@pytest.mark.kafka
def test_bad_lines_are_one_line_each_and_the_good_ones_are_sent(
    kafka_bootstrap: str, kafka_admin: AdminClient, tmp_path: Path
) -> None:
    topics = TopicSettings(prefix=f"t{uuid.uuid4().hex[:10]}.", partitions=1)
    from conftest import _create

    _create(kafka_admin, topics.all_topics(), 1)
    src = tmp_path / "in.txt"
    src.write_bytes(
        b"first plain text\n"
        b'{"text": "numbered", "request_id": 42}\n'
        b"caf\xe9 in latin-1\n"
        b'{"text": "good json", "request_id": "j-1"}\n'
        b'{"text": "   "}\n'
        + b"x" * 61
        + b"\n"
        + b'{"text": "late", "deadline_ms": "soon"}\n'
        + b"{not json\n"
        + b"last plain text\n"
    )
    env = {
        "PIPELINE_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "PIPELINE_TOPICS_PREFIX": topics.prefix,
        "PIPELINE_VALIDATION_MAX_TEXT_CHARS": "60",
    }
    done = _run(["produce", "--lane", "bulk", str(src)], env)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr
    assert len(done.stdout.split()) == 3  # three request ids
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("skipped")]
    assert errors == [
        'skipped line 2: "request_id" must be a string, got 42',
        "skipped line 3: not UTF-8 (byte 0xe9 at column 4)",
        "skipped line 5: text is empty",
        "skipped line 6: text of 61 characters exceeds the cap of 60 "
        "(PIPELINE_VALIDATION_MAX_TEXT_CHARS)",
        'skipped line 7: "deadline_ms" must be an integer, got "soon"',
        "skipped line 8: not valid JSON (Expecting property name enclosed in double quotes "
        "at column 2)",
    ]
    assert done.stderr.strip().endswith("Error: 6 line(s) could not be sent")
    sent = _lane_values(kafka_bootstrap, topics.lane_topic("bulk"))
    assert [r["text"] for r in sent] == ["first plain text", "good json", "last plain text"]


@pytest.mark.kafka
def test_topics_list_describe_and_the_partition_warning(
    kafka_bootstrap: str, kafka_admin: AdminClient
) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}."
    env = {"PIPELINE_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "PIPELINE_TOPICS_PREFIX": prefix}
    runner = CliRunner()
    before = runner.invoke(main, ["topics", "list"], env=env)
    assert before.exit_code == 1
    assert before.output.count("missing") == 6  # five topics and the error line
    created = runner.invoke(main, ["topics", "create", "--partitions", "2"], env=env)
    assert created.exit_code == 0, created.output
    listed = runner.invoke(main, ["topics", "list"], env=env)
    assert listed.exit_code == 0, listed.output
    assert f"{TopicSettings(prefix=prefix).lane_topic('bulk')}\tlane bulk\t2 partitions" in (
        listed.output
    )
    described = runner.invoke(main, ["topics", "describe"], env=env)
    assert described.exit_code == 0, described.output
    states = json.loads(described.output)
    assert [s["partitions"] for s in states] == [2] * 5
    settings = Settings.from_env(env)
    assert states[4]["retention_ms"] == settings.topics.dlq_retention_ms
    again = runner.invoke(main, ["topics", "create", "--partitions", "4"], env=env)
    assert again.exit_code == 0, again.output
    assert (
        f"warning: {settings.topics.lane_topic('realtime')} exists with 2 partitions, not 4; "
        "it was left as it is"
    ) in again.output
    from conftest import _delete

    _delete(kafka_admin, settings.topics.all_topics())


def test_settings_shows_values_in_effect_and_suggests_a_name() -> None:
    runner = CliRunner()
    shown = runner.invoke(main, ["settings"], env={"PIPELINE_TOPICS_PREFIX": "staging."})
    assert shown.exit_code == 0, shown.output
    assert "PIPELINE_TOPICS_PREFIX=''\n    in effect: 'staging.' (set in the environment)" in (
        shown.output
    )
    typo = runner.invoke(main, ["settings"], env={"PIPELINE_TOPIC_PREFIX": "staging."})
    assert typo.exit_code == 1
    assert (
        "unknown setting PIPELINE_TOPIC_PREFIX (did you mean PIPELINE_TOPICS_PREFIX?)"
        in typo.output
    )
    other = runner.invoke(main, ["topics", "list"], env={"PIPELINE_TOPIC_PREFIX": "x"})
    assert other.exit_code == 1
    assert "(did you mean PIPELINE_TOPICS_PREFIX?)" in other.output
    assert "Traceback" not in other.output


def test_version() -> None:
    from importlib.metadata import version

    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"pipeline, version {version('pipeline')}"


def test_kafka_status_exits_1_when_no_broker_runs(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["kafka", "status", "--data-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert json.loads(result.output)["running"] is False


def test_the_library_log_goes_through_python_logging(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    import logging

    from pipeline.errors import BrokerUnavailable
    from pipeline.kafka.client import RequestProducer

    (port,) = free_ports(1)
    dead = Settings.from_env({"PIPELINE_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"})
    with caplog.at_level(logging.DEBUG, logger="librdkafka"), pytest.raises(BrokerUnavailable):
        RequestProducer(dead, connect_timeout_s=1.0)
    assert any("Connection refused" in r.getMessage() for r in caplog.records)
    assert all(r.levelno <= logging.INFO for r in caplog.records if r.name == "librdkafka")
    assert "|FAIL|" not in capfd.readouterr().err


def test_a_misspelt_setting_stops_a_worker_in_one_line() -> None:
    from pipeline.tools.supervise import FAUST

    done = subprocess.run(
        [FAUST, "-A", "pipeline.app", "worker", "-l", "info"],
        capture_output=True,
        text=True,
        env={**_clean_env(), "PIPELINE_TOPIC_PREFIX": "staging."},
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert (done.stdout + done.stderr).strip().splitlines() == [
        "pipeline: unknown setting(s) PIPELINE_TOPIC_PREFIX (did you mean "
        "PIPELINE_TOPICS_PREFIX?); run `pipeline settings` for the list"
    ]


@pytest.mark.parametrize("call", ["create", "describe", "limits"])
def test_the_admin_clients_hand_their_log_lines_to_logging(
    call: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """librdkafka queues an admin client's log lines for ``poll``, which no admin call
    makes: each call that made the client polls it once when done, so a refused
    connection reaches the ``librdkafka`` logger instead of dying with the client."""
    import logging

    from pipeline.errors import BrokerUnavailable
    from pipeline.kafka.topic_limits import message_size_warnings
    from pipeline.kafka.topics import create_topics, describe_topics

    (port,) = free_ports(1)
    dead = Settings.from_env({"PIPELINE_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"})
    calls: dict[str, Callable[[], object]] = {
        "create": lambda: create_topics(dead, timeout_s=1.0, connect_timeout_s=1.0),
        "describe": lambda: describe_topics(dead, timeout_s=1.0, connect_timeout_s=1.0),
        "limits": lambda: message_size_warnings(dead, timeout_s=1.0),
    }
    with caplog.at_level(logging.DEBUG, logger="librdkafka"), pytest.raises(Exception) as raised:
        calls[call]()
    if call != "limits":
        assert raised.type is BrokerUnavailable
    assert any("Connection refused" in r.getMessage() for r in caplog.records)
    assert "|FAIL|" not in capfd.readouterr().err
