"""The start-up check of the answer topics' max.message.bytes, on a real broker."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)
from harness import Deployment

from pipeline.kafka.producer import MAX_MESSAGE_BYTES
from pipeline.kafka.topic_limits import message_size_warnings, warn_small_topics
from pipeline.kafka.topics import admin_client

pytestmark = [pytest.mark.kafka]


def test_a_results_topic_that_refuses_the_largest_answer_is_one_line_saying_what_to_set(
    kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dep = Deployment.create(kafka_bootstrap, tmp_path, partitions=1)
    assert message_size_warnings(dep.settings) == []  # the broker's default takes it
    results = dep.settings.topics.results_topic
    admin = admin_client(dep.settings)
    entry = ConfigEntry("max.message.bytes", "500000", incremental_operation=AlterConfigOpType.SET)
    change = ConfigResource("topic", results, incremental_configs=[entry])
    admin.incremental_alter_configs([change])[change].result(30)
    with caplog.at_level(logging.WARNING, logger="pipeline.kafka.topic_limits"):
        assert warn_small_topics(dep.settings) == 1
    (line,) = [r.getMessage() for r in caplog.records]
    assert results in line and "max.message.bytes=500000" in line
    assert f"at least {MAX_MESSAGE_BYTES}" in line and "\n" not in line
