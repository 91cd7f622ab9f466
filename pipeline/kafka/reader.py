"""Reading answers: results and dead letters, from a chosen point, optionally by request id.

:func:`read_answers` assigns every partition of the results and dead-letter
topics itself (no consumer-group rebalance, nothing committed) from where the
caller says: the beginning, the end (answers written from now on), or the
first answer written at or after an epoch-ms time. It decodes every encoding
the codecs read (Avro single-object, JSON, or the Confluent Schema Registry's
framing when ``PIPELINE_REGISTRY_URL`` is set, its writer schemas looked up
there); records that decode as none are skipped.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as TP

from pipeline.codecs.avro import dead_letter_codec, result_codec
from pipeline.codecs.registry import writer_lookup
from pipeline.errors import BrokerUnavailable, ConfigurationError, PermanentError
from pipeline.kafka.security import AuthWatch, client_config, connect
from pipeline.observability.logs import librdkafka_log
from pipeline.settings import Settings

__all__ = ["Answer", "Start", "read_answers"]

#: Where reading starts: the topics' beginning, their end, or an epoch-ms time.
Start = Literal["beginning", "end"] | int


@dataclass(frozen=True)
class Answer:
    """A decoded record from the results or dead-letter topic."""

    kind: str  # "result" or "dead_letter"
    record: dict[str, Any]
    topic: str
    partition: int
    offset: int
    timestamp_ms: int = 0

    @property
    def request_id(self) -> str | None:
        """The answered request's id (a dead letter may have none)."""
        rid = self.record.get("request_id")
        return rid if isinstance(rid, str) else None


def _start_offsets(consumer: Consumer, parts: list[TP], start: Start, timeout_s: float) -> list[TP]:
    if start == "beginning":
        return [TP(p.topic, p.partition, OFFSET_BEGINNING) for p in parts]
    if start == "end":
        # Resolved now, not at the first fetch: an answer written between this call
        # and the fetch must not be skipped.
        out = []
        for p in parts:
            _low, high = consumer.get_watermark_offsets(p, timeout=timeout_s)
            out.append(TP(p.topic, p.partition, high))
        return out
    found = consumer.offsets_for_times(
        [TP(p.topic, p.partition, int(start)) for p in parts], timeout=timeout_s
    )
    return [TP(p.topic, p.partition, p.offset if p.offset >= 0 else OFFSET_END) for p in found]


def _unread_ends(consumer: Consumer, assignment: list[TP]) -> dict[tuple[str, int], int]:
    """Each assigned partition's end offset now, for those with records left to read."""
    ends = {}
    for p in assignment:
        _low, high = consumer.get_watermark_offsets(p, timeout=10)
        if p.offset != OFFSET_END and high > max(p.offset, 0):
            ends[(p.topic, p.partition)] = high
    return ends


@dataclass
class _Stop:
    """When reading stops (see :func:`read_answers`)."""

    wanted: set[str] | None
    expect: int | None
    timeout_s: float | None
    idle_s: float | None
    ends: dict[tuple[str, int], int]
    until_end: bool
    seen: int = 0
    begun: float = field(default_factory=time.monotonic)
    last: float = field(default_factory=time.monotonic)

    def reached(self) -> bool:
        now = time.monotonic()
        return (
            (self.wanted is not None and not self.wanted)
            or (self.expect is not None and self.seen >= self.expect)
            or (self.until_end and not self.ends)
            or (self.timeout_s is not None and now - self.begun > self.timeout_s)
            or (self.idle_s is not None and now - self.last > self.idle_s)
        )

    def read(self, topic: str, partition: int, offset: int) -> None:
        self.last = time.monotonic()
        end = self.ends.get((topic, partition))
        if end is not None and offset + 1 >= end:
            del self.ends[(topic, partition)]

    def idle(self, consumer: Consumer) -> None:
        # Control records (transaction markers) are never delivered: go by position.
        if self.ends:
            for p in consumer.position([TP(t, n) for t, n in self.ends]):
                if p.offset >= self.ends[(p.topic, p.partition)]:
                    del self.ends[(p.topic, p.partition)]

    def keep(self, answer: Answer) -> bool:
        if self.wanted is not None:
            if answer.request_id not in self.wanted:
                return False
            self.wanted.discard(answer.request_id)
        self.seen += 1
        return True


def read_answers(
    settings: Settings,
    *,
    request_ids: Iterable[str] | None = None,
    start: Start = "beginning",
    expect: int | None = None,
    timeout_s: float | None = 60.0,
    idle_s: float | None = None,
    until_end: bool = False,
    group_id: str | None = None,
    on_start: Callable[[], object] | None = None,
) -> Iterator[Answer]:
    """Yield results and dead letters from ``start`` on, in each partition's order.

    With ``request_ids``, only answers to those ids, and it stops once each has
    one. It also stops after ``expect`` answers, after ``idle_s`` without a new
    one, at ``timeout_s`` (None: never), or with ``until_end`` once it has read
    up to the topics' ends as they were when it started, whichever comes first.
    Nothing is committed (``group_id`` only names the consumer to the broker).
    ``on_start`` is called once the start offsets are fixed: an answer written
    after that call is read.
    Raises BrokerUnavailable when no broker answers, ConfigurationError when
    the topics do not exist, RegistryUnavailable when a registry-framed answer's
    schema is needed and the registry does not answer.
    """
    begun = time.monotonic()
    watch = AuthWatch(settings)
    consumer = Consumer(
        {
            **client_config(settings, watch),
            **librdkafka_log(),
            "group.id": group_id or f"pipeline-reader-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
    )
    results, dlq = settings.topics.results_topic, settings.topics.dlq_topic
    codecs = {results: ("result", result_codec()), dlq: ("dead_letter", dead_letter_codec())}
    writer_of = writer_lookup(settings.registry)
    try:
        meta = connect(consumer, watch, 10.0 if timeout_s is None else min(timeout_s, 10.0))
        missing = [t for t in (results, dlq) if t not in meta.topics]
        if missing:
            raise ConfigurationError(
                f"topic(s) {', '.join(missing)} do not exist; create them with "
                "`pipeline topics create` (or check PIPELINE_TOPICS_PREFIX)"
            )
        parts = [TP(t, p) for t in (results, dlq) for p in sorted(meta.topics[t].partitions)]
        assignment = _start_offsets(consumer, parts, start, 10)
        ends = _unread_ends(consumer, assignment) if until_end else {}
        wanted = None if request_ids is None else set(request_ids)
        stop = _Stop(wanted, expect, timeout_s, idle_s, ends, until_end, begun=begun)
        consumer.assign(assignment)
        if on_start is not None:
            on_start()
        while not stop.reached():
            msg = consumer.poll(0.2)
            watch.check()
            if msg is None:
                stop.idle(consumer)
                continue
            err = msg.error()
            if err is not None:
                if err.code() in (KafkaError._PARTITION_EOF, KafkaError.UNKNOWN_TOPIC_OR_PART):
                    continue
                raise BrokerUnavailable(str(err))
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            assert topic is not None and partition is not None and offset is not None
            stop.read(topic, partition, offset)
            kind, codec = codecs[topic]
            try:
                record = codec.decode_any(msg.value(), writer_of)
            except PermanentError:
                continue
            answer = Answer(kind, record, topic, partition, offset, msg.timestamp()[1])
            if stop.keep(answer):
                yield answer
    except KafkaException as exc:
        raise BrokerUnavailable(str(exc)) from exc
    finally:
        consumer.close()
