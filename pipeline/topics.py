"""Create and inspect the pipeline's topics (confluent-kafka admin)."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from pipeline.errors import ConfigurationError
from pipeline.security import AuthWatch, client_config, connect
from pipeline.settings import Settings, TopicSettings

__all__ = ["admin_client", "create_topics", "topic_specs"]


def admin_client(settings: Settings, watch: AuthWatch | None = None) -> AdminClient:
    """An admin client that connects as every other client does (``pipeline.security``)."""
    return AdminClient(client_config(settings, watch))


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
) -> dict[str, str]:
    """Create every pipeline topic; return ``{topic: "created" | "exists"}``.

    Existing lane topics must all have the same partition count (they are
    co-partitioned with the dedupe table); a mismatch raises
    ConfigurationError saying what to fix.
    """
    watch = AuthWatch(settings)
    admin = admin_client(settings, watch)
    connect(admin, watch, min(timeout_s, 10))
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
    counts = {len(meta[t].partitions) for t in settings.topics.all_topics()[:3] if t in meta}
    if len(counts) > 1:
        raise ConfigurationError(
            f"lane topics have different partition counts {sorted(counts)}; they must match "
            "(add partitions with kafka-topics --alter until they do)"
        )
    return status
