"""Helpers shared by the ``pipeline`` commands (pipeline.tools.commands.options)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.settings import LocalKafkaSettings, Settings
from pipeline.tools.commands.options import local_broker_unless
from pipeline.tools.kafka_local import LocalKafka


def test_a_given_bootstrap_is_used_and_no_broker_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local = LocalKafka(LocalKafkaSettings(data_dir=str(tmp_path)))
    settings = Settings().replace(local_kafka=local.settings)
    with local_broker_unless("broker:9092", settings, keep=False) as address:
        assert address == "broker:9092"
    assert local.status()["running"] is False
    assert capsys.readouterr().err == ""


@pytest.mark.kafka
def test_a_running_local_broker_is_reused_and_left_running(
    started_kafka: LocalKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings().replace(local_kafka=started_kafka.settings)
    with local_broker_unless(None, settings, keep=False) as address:
        assert address == started_kafka.bootstrap
    assert started_kafka.status()["running"] is True
    assert capsys.readouterr().err == "==> local broker reused\n"


@pytest.mark.kafka
@pytest.mark.slow
def test_a_local_broker_it_started_is_stopped_unless_kept(
    make_local_kafka: Callable[[], LocalKafka], capsys: pytest.CaptureFixture[str]
) -> None:
    broker = make_local_kafka()
    settings = Settings().replace(local_kafka=broker.settings)
    with local_broker_unless(None, settings, keep=True) as address:
        assert address == broker.bootstrap
        assert broker.status()["answering"] is True
    assert broker.status()["running"] is True  # kept
    assert capsys.readouterr().err == "==> local broker starting\n"
    broker.down()
    with local_broker_unless(None, settings, keep=False):
        assert broker.status()["running"] is True
    assert broker.status()["running"] is False
    assert capsys.readouterr().err == ("==> local broker starting\n==> stopping the local broker\n")
