"""The local broker launcher against a real broker (`pipeline kafka`).

The code under test: :mod:`pipeline.tools.kafka_local`.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from support.kafka import read_topic

from pipeline.cli import main
from pipeline.errors import ConfigurationError
from pipeline.settings import LocalKafkaSettings
from pipeline.tools.kafka_local import LocalKafka


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    errors: list[object] = []
    for key, value in records:
        producer.produce(topic, value, key, on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(30) == 0
    assert errors == [None] * len(records)


@pytest.mark.kafka
def test_produce_consume_round_trip(
    kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory("roundtrip", partitions=1)
    records = [(f"k{i}".encode(), f"value {i}".encode()) for i in range(5)]
    _produce(kafka_bootstrap, topic, records)
    assert [(m.key(), m.value()) for m in read_topic(kafka_bootstrap, topic)] == records


@pytest.mark.kafka
def test_kafka_status_cli(started_kafka: LocalKafka, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        main,
        [
            "kafka",
            "status",
            "--port",
            str(started_kafka.port),
            "--data-dir",
            str(started_kafka.data_dir),
        ],
    )
    assert result.exit_code == 0, result.output
    state = json.loads(result.output)
    assert state["running"] is True
    assert state["answering"] is True
    assert state["pid"] == started_kafka.read_pid()
    assert state["bootstrap"] == started_kafka.bootstrap
    result = runner.invoke(main, ["kafka", "status", "--data-dir", str(tmp_path / "none")])
    assert result.exit_code == 1, result.output  # not running: scripts can test it
    assert json.loads(result.output)["running"] is False


def test_port_taken_by_someone_else(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        broker = LocalKafka(LocalKafkaSettings(port=port, data_dir=str(tmp_path)))
        with pytest.raises(ConfigurationError, match=f"port {port} .* taken"):
            broker.up()
    assert broker.read_pid() is None


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.kafka
@pytest.mark.slow
def test_up_idempotent_down_and_restart(make_local_kafka: Callable[[], LocalKafka]) -> None:
    """CLI up, class up again (same pid), CLI down (no process left), restart keeps data."""
    broker = make_local_kafka()
    env = {"PIPELINE_LOCAL_KAFKA_CONTROLLER_PORT": str(broker.controller_port)}
    args = ["--port", str(broker.port), "--data-dir", str(broker.data_dir)]
    runner = CliRunner()
    try:
        result = runner.invoke(main, ["kafka", "up", *args], env=env)
        assert result.exit_code == 0, result.output
        assert broker.bootstrap in result.output
        pid = broker.read_pid()
        assert pid is not None

        # Idempotent: the running broker is reused, not restarted (same process).
        assert broker.up() == broker.bootstrap
        assert broker.read_pid() == pid

        topic = f"restart.{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
        _produce(broker.bootstrap, topic, [(b"k", b"kept across restarts")])

        result = runner.invoke(main, ["kafka", "down", *args], env=env)
        assert result.exit_code == 0, result.output
        assert "stopped" in result.output
        assert _gone(pid)
        assert not broker.pid_file.exists()
        assert broker.status()["running"] is False
        assert broker.down() is False

        assert broker.up() == broker.bootstrap
        assert broker.read_pid() not in (None, pid)
        kept = [(m.key(), m.value()) for m in read_topic(broker.bootstrap, topic)]
        assert kept == [(b"k", b"kept across restarts")]
    finally:
        last = broker.read_pid()
        broker.down()
        if last is not None:
            assert _gone(last)
