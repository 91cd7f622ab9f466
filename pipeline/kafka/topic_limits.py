"""The start-up check that the topics the worker writes take its largest record.

The answer producer sends records up to :data:`~pipeline.kafka.producer.MAX_MESSAGE_BYTES`
(librdkafka's ``message.max.bytes``). A results, dead-letter or dedupe-changelog
topic whose ``max.message.bytes`` is lower refuses such a record for good
(``MSG_SIZE_TOO_LARGE``): a large result becomes a dead letter, and a large dead
letter stops the worker. Nothing in the topic's name says so, so the worker says
it once at start-up, one line per topic, with what to set.
"""

from __future__ import annotations

import logging

from pipeline.kafka.producer import MAX_MESSAGE_BYTES
from pipeline.settings import Settings
from pipeline.worker.dedupe import changelog_topic

__all__ = ["message_size_warnings", "warn_small_topics"]

log = logging.getLogger(__name__)


def message_size_warnings(settings: Settings, *, timeout_s: float = 10.0) -> list[str]:
    """One line for each topic the worker writes (results, dead letters, the dedupe
    changelog) whose ``max.message.bytes`` is below what the answer producer may send;
    a topic that does not exist (yet) is not judged. Raises what the admin client
    raises when the broker cannot tell."""
    from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

    from pipeline.kafka.topics import admin_session

    topics = [
        settings.topics.results_topic,
        settings.topics.dlq_topic,
        changelog_topic(settings.worker.app_id),
    ]
    with admin_session(settings) as admin:
        present = set(admin.list_topics(timeout=timeout_s).topics)
        resources = [ConfigResource("topic", t) for t in topics if t in present]
        if not resources:
            return []
        described = admin.describe_configs(resources, request_timeout=timeout_s)
        found = {res.name: fut.result().get("max.message.bytes") for res, fut in described.items()}
    lines: list[str] = []
    for name, entry in found.items():
        if entry is None or int(entry.value) >= MAX_MESSAGE_BYTES:
            continue
        lines.append(
            f"topic {name}: max.message.bytes={entry.value} is below the "
            f"{MAX_MESSAGE_BYTES} bytes the worker may send (larger answers are refused); "
            f"set it to at least {MAX_MESSAGE_BYTES}: kafka-configs --alter --entity-type "
            f"topics --entity-name {name} --add-config max.message.bytes={MAX_MESSAGE_BYTES}"
        )
    return lines


def warn_small_topics(settings: Settings) -> int:
    """Log :func:`message_size_warnings` as warnings; never raises (a broker that cannot
    tell is said at debug level). Returns how many topics were too small."""
    try:
        lines = message_size_warnings(settings)
    except Exception as exc:
        log.debug("max.message.bytes of the answer topics not checked: %r", exc)
        return 0
    for line in lines:
        log.warning("%s", line)
    return len(lines)
