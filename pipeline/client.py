"""A small client for producing requests and reading answers (confluent-kafka).

>>> with RequestProducer(settings) as producer:           # doctest: +SKIP
...     producer.send("hello world", lane="realtime")
...     producer.flush()

The producer is idempotent with ``acks=all`` and keys each request by its
content hash with the Java client's partitioner (murmur2), so identical texts
meet on one partition whichever client produced them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from pipeline.codec import dead_letter_codec, request_codec, result_codec
from pipeline.dedupe import content_hash
from pipeline.errors import BrokerUnavailable, DecodeError, PublishError, ValidationError
from pipeline.security import AuthWatch, client_config
from pipeline.settings import LANES, Settings

__all__ = ["Answer", "RequestProducer", "read_answers", "request_bytes"]


def request_bytes(
    text: str,
    *,
    request_id: str | None = None,
    created_at_ms: int | None = None,
    deadline_ms: int | None = None,
    source: str = "",
    metadata: Mapping[str, str] | None = None,
) -> tuple[str, bytes]:
    """Encode an InferenceRequest; return ``(request_id, value)``."""
    rid = request_id or uuid.uuid4().hex
    value = request_codec().encode(
        {
            "request_id": rid,
            "text": text,
            "created_at_ms": int(time.time() * 1000) if created_at_ms is None else created_at_ms,
            "deadline_ms": deadline_ms,
            "source": source,
            "metadata": dict(metadata or {}),
        }
    )
    return rid, value


class RequestProducer:
    """Produces InferenceRequests to the lane topics; ``flush`` waits for every ack."""

    def __init__(self, settings: Settings, *, source: str = "pipeline.client") -> None:
        self.settings = settings
        self.source = source
        self._errors: list[str] = []
        self.acked = 0
        self._watch = AuthWatch(settings)
        self._producer = Producer(
            {
                **client_config(settings, self._watch),
                "client.id": settings.kafka.client_id + "-producer",
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "partitioner": "murmur2_random",
                "message.timeout.ms": 30000,
            }
        )

    def connect(self, timeout_s: float = 10.0) -> None:
        """Connect to the cluster now, so the first requests do not wait for it.

        A new producer connects (and, idempotent, gets its producer id) on its
        first send: measured here, that first acknowledgement took 100-500 ms,
        against under 1 ms once connected. Raises :class:`BrokerUnavailable`
        when no broker answers within ``timeout_s``.
        """
        try:
            self._producer.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            self._watch.check()
            raise BrokerUnavailable(
                f"no broker answered within {timeout_s}s at "
                f"{self.settings.kafka.bootstrap_servers}: {exc}"
            ) from exc
        self._watch.check()

    def __enter__(self) -> RequestProducer:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.flush()

    def _on_delivery(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            self._errors.append(str(err))
        else:
            self.acked += 1

    def send(
        self,
        text: str,
        *,
        lane: str = "standard",
        request_id: str | None = None,
        deadline_ms: int | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> str:
        """Queue one request for ``lane``; return its request_id."""
        if lane not in LANES:
            raise ValidationError(f"unknown lane {lane!r}; expected one of {', '.join(LANES)}")
        rid, value = request_bytes(
            text,
            request_id=request_id,
            deadline_ms=deadline_ms,
            source=self.source,
            metadata=metadata,
        )
        key = content_hash(text, self.settings.model.model_id).encode("ascii")
        self.send_raw(lane, key, value)
        return rid

    def send_raw(self, lane: str, key: bytes | None, value: bytes) -> None:
        """Queue pre-encoded bytes (any bytes: tests use this for hostile input)."""
        topic = self.settings.topics.lane_topic(lane)
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, on_delivery=self._on_delivery)
                break
            except BufferError:
                self._producer.poll(0.1)  # local queue full: wait for acks, then retry
                self._watch.check()
        self._producer.poll(0)
        self._watch.check()

    def flush(self, timeout_s: float = 60.0) -> None:
        """Wait until every queued request is acknowledged; raise if any failed, and
        AuthenticationFailed as soon as the broker refuses this client."""
        deadline = time.monotonic() + timeout_s
        remaining = self._producer.flush(0)
        while remaining and time.monotonic() < deadline:
            self._watch.check()
            remaining = self._producer.flush(min(0.5, max(0.0, deadline - time.monotonic())))
        self._watch.check()
        if remaining:
            raise BrokerUnavailable(
                f"{remaining} requests not acknowledged within {timeout_s}s; "
                f"is a broker running at {self.settings.kafka.bootstrap_servers}?"
            )
        if self._errors:
            errors, self._errors = self._errors, []
            raise PublishError(f"{len(errors)} requests failed: {errors[0]}")


@dataclass(frozen=True)
class Answer:
    """A decoded record from the results or dead-letter topic."""

    kind: str  # "result" or "dead_letter"
    record: dict[str, Any]
    topic: str
    partition: int
    offset: int


def read_answers(
    settings: Settings,
    *,
    expect: int | None = None,
    timeout_s: float = 60.0,
    idle_s: float | None = None,
    group_id: str | None = None,
) -> Iterator[Answer]:
    """Yield results and dead letters from the start of both topics.

    Stops after ``expect`` answers, after ``idle_s`` without a new one, or at
    ``timeout_s``, whichever comes first. Uses a throwaway consumer group
    unless ``group_id`` is given.
    """
    watch = AuthWatch(settings)
    consumer = Consumer(
        {
            **client_config(settings, watch),
            "group.id": group_id or f"pipeline-reader-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    results, dlq = settings.topics.results_topic, settings.topics.dlq_topic
    try:
        consumer.subscribe([results, dlq])
        seen = 0
        end = time.monotonic() + timeout_s
        last = time.monotonic()
        while time.monotonic() < end and (expect is None or seen < expect):
            if idle_s is not None and time.monotonic() - last > idle_s:
                break
            msg = consumer.poll(0.2)
            watch.check()
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    continue
                raise BrokerUnavailable(str(err))
            last = time.monotonic()
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            assert topic is not None and partition is not None and offset is not None
            codec = result_codec() if topic == results else dead_letter_codec()
            try:
                record = codec.decode(msg.value())
            except DecodeError:
                continue
            seen += 1
            yield Answer(
                kind="result" if topic == results else "dead_letter",
                record=record,
                topic=topic,
                partition=partition,
                offset=offset,
            )
    except KafkaException as exc:
        raise BrokerUnavailable(str(exc)) from exc
    finally:
        consumer.close()
