"""Create and inspect the pipeline's topics (confluent-kafka admin)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from pipeline.errors import ConfigurationError
from pipeline.kafka.client import require_bootstrap
from pipeline.kafka.security import AuthWatch, client_config, connect
from pipeline.observability.logs import librdkafka_log, serve_logs
from pipeline.settings import LANES, Settings, TopicSettings
from pipeline.worker.dedupe import Retention, changelog_topic

log = logging.getLogger(__name__)

__all__ = [
    "TopicState",
    "admin_client",
    "admin_session",
    "create_topics",
    "delete_topics_named",
    "describe_topics",
    "topic_specs",
]


def admin_client(settings: Settings, watch: AuthWatch | None = None) -> AdminClient:
    """An admin client that connects as every other client does (``pipeline.kafka.security``),
    its library's log lines routed through Python logging."""
    return AdminClient({**client_config(settings, watch), **librdkafka_log()})


@contextlib.contextmanager
def admin_session(settings: Settings, watch: AuthWatch | None = None) -> Iterator[AdminClient]:
    """:func:`admin_client` for one block; when the block ends (raising or not), the log
    lines librdkafka queued for the client reach logging. librdkafka queues them for
    ``poll``, which no admin call makes: unserved, a refused connection's lines died
    with the client, unlogged."""
    admin = admin_client(settings, watch)
    try:
        yield admin
    finally:
        serve_logs(admin)


def delete_topics_named(
    settings: Settings, prefixes: tuple[str, ...], *, timeout_s: float = 30.0
) -> list[str]:
    """Delete every topic whose name starts with one of ``prefixes``; return the names
    deleted. Raises what the admin client raises (the caller decides whether a topic
    left behind matters)."""
    with admin_session(settings) as admin:
        names = sorted(
            t for t in admin.list_topics(timeout=timeout_s).topics if t.startswith(prefixes)
        )
        if names:
            futures = admin.delete_topics(names, operation_timeout=timeout_s)
            for future in futures.values():
                future.result(timeout=timeout_s)
    return names


def topic_specs(
    topics: TopicSettings, *, partitions: int | None = None, replication: int | None = None
) -> list[NewTopic]:
    """The topics to create: three co-partitioned lanes, results, dead letters."""
    parts = partitions or topics.partitions
    repl = replication or topics.replication
    specs = [
        NewTopic(name, parts, repl, config={"retention.ms": str(topics.retention_ms)})
        for name in topics.all_topics()[:-1]
    ]
    specs.append(
        NewTopic(
            topics.dlq_topic, parts, repl, config={"retention.ms": str(topics.dlq_retention_ms)}
        )
    )
    return specs


def create_topics(
    settings: Settings,
    *,
    partitions: int | None = None,
    replication: int | None = None,
    timeout_s: float = 30.0,
    connect_timeout_s: float = 10.0,
) -> dict[str, str]:
    """Create every pipeline topic; return ``{topic: "created" | "exists"}``.

    Existing lane topics must all have the same partition count (they are
    co-partitioned with the dedupe table); a mismatch raises
    ConfigurationError saying what to fix.
    """
    require_bootstrap(settings)
    watch = AuthWatch(settings)
    with admin_session(settings, watch) as admin:
        connect(admin, watch, min(timeout_s, connect_timeout_s))
        specs = topic_specs(settings.topics, partitions=partitions, replication=replication)
        status: dict[str, str] = {}
        for name, fut in admin.create_topics(specs, request_timeout=timeout_s).items():
            try:
                fut.result()
                status[name] = "created"
            except KafkaException as exc:
                err = exc.args[0]
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    status[name] = "exists"
                else:
                    raise ConfigurationError(f"could not create {name}: {err}") from exc
        meta = admin.list_topics(timeout=timeout_s).topics
        lanes = [settings.topics.lane_topic(lane) for lane in LANES]
        counts = {len(meta[t].partitions) for t in lanes if t in meta}
        if len(counts) > 1:
            raise ConfigurationError(
                f"lane topics have different partition counts {sorted(counts)}; they must match "
                "(add partitions with kafka-topics --alter until they do)"
            )
        parts = max(counts) if counts else (partitions or settings.topics.partitions)
        name = changelog_topic(settings.worker.app_id)
        status[name] = dedupe_changelog(admin, settings, parts, replication, timeout_s)
    return status


@dataclass(frozen=True)
class TopicState:
    """One pipeline topic as the cluster has it (``partitions`` 0: it does not exist)."""

    name: str
    role: str
    partitions: int = 0
    replication: int = 0
    retention_ms: str = ""

    @property
    def exists(self) -> bool:
        return self.partitions > 0


def describe_topics(
    settings: Settings, *, timeout_s: float = 30.0, connect_timeout_s: float = 10.0
) -> list[TopicState]:
    """The state of every pipeline topic, in :meth:`TopicSettings.all_topics` order."""
    from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

    require_bootstrap(settings)
    watch = AuthWatch(settings)
    with admin_session(settings, watch) as admin:
        meta = connect(admin, watch, min(timeout_s, connect_timeout_s)).topics
        roles = [f"lane {lane}" for lane in LANES] + ["results", "dead letters"]
        present = [t for t in settings.topics.all_topics() if t in meta]
        retention: dict[str, str] = {}
        if present:
            resources = [ConfigResource("topic", t) for t in present]
            for res, fut in admin.describe_configs(resources, request_timeout=timeout_s).items():
                entry = fut.result().get("retention.ms")
                retention[res.name] = "" if entry is None else str(entry.value)
    states = []
    for name, role in zip(settings.topics.all_topics(), roles, strict=True):
        if name not in meta:
            states.append(TopicState(name, role))
            continue
        parts = meta[name].partitions
        repl = max((len(p.replicas) for p in parts.values()), default=0)
        states.append(TopicState(name, role, len(parts), repl, retention.get(name, "")))
    return states


def dedupe_changelog(
    admin: AdminClient,
    settings: Settings,
    partitions: int,
    replication: int | None,
    timeout_s: float,
) -> str:
    """Create the dedupe table's changelog topic (compacted, pruned past the dedupe TTL,
    :meth:`pipeline.worker.dedupe.Retention.changelog_config`), or bring an existing one's cleanup
    settings in line: "created", "exists" (already in line), "aligned" (changed now),
    or "unchecked" (the cluster refused to show or change them; logged).

    Faust creates the topic the same way when it is missing; an existing topic keeps
    its settings until this runs (a changelog made before kept everything forever).
    """
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
    )

    name = changelog_topic(settings.worker.app_id)
    want = Retention.of_seconds(settings.dedupe.ttl_s).changelog_config()
    repl = replication or settings.topics.replication
    try:
        admin.create_topics([NewTopic(name, partitions, repl, config=want)])[name].result(timeout_s)
        return "created"
    except KafkaException as exc:
        err = exc.args[0]
        if not (isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS):
            raise ConfigurationError(f"could not create {name}: {err}") from exc
    try:
        resource = ConfigResource("topic", name)
        have = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result()
        stale = {k: v for k, v in want.items() if k not in have or have[k].value != v}
        if not stale:
            return "exists"
        entries = [
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in stale.items()
        ]
        change = ConfigResource("topic", name, incremental_configs=entries)
        admin.incremental_alter_configs([change], request_timeout=timeout_s)[change].result()
    except KafkaException as exc:
        log.warning("cannot check or change the settings of %s: %s", name, exc.args[0])
        return "unchecked"
    log.info("%s: set %s", name, ", ".join(f"{k}={v}" for k, v in sorted(stale.items())))
    return "aligned"
