"""Create and inspect the pipeline's topics (confluent-kafka admin)."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from pipeline.errors import BrokerUnavailable, ConfigurationError
from pipeline.settings import Settings, TopicSettings

__all__ = ["admin_client", "create_topics", "topic_specs"]


def admin_client(settings: Settings) -> AdminClient:
    return AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers})


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
    admin = admin_client(settings)
    try:
        admin.list_topics(timeout=min(timeout_s, 10))
    except KafkaException as exc:
        raise BrokerUnavailable(
            f"no broker at {settings.kafka.bootstrap_servers} ({exc}); start one with "
            "`pipeline kafka up` or set PIPELINE_KAFKA_BOOTSTRAP_SERVERS"
        ) from exc
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
