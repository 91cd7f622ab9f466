"""A small client for producing requests and reading answers (confluent-kafka).

>>> with RequestProducer(settings) as producer:           # doctest: +SKIP
...     rid = producer.send("hello world", lane="realtime")
...     producer.flush()
...     for answer in producer.answers([rid]):
...         print(answer.kind, answer.record)

The producer is idempotent with ``acks=all`` and keys each request by its
content hash with the Java client's partitioner (murmur2), so identical texts
meet on one partition whichever client produced them. Requests are Avro
single-object encoded, or (``framing="registry"``) in the Confluent Schema
Registry's framing, the schema registered under each lane topic's
``<topic>-value`` subject at ``PIPELINE_REGISTRY_URL``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaError, Producer

from pipeline.codecs.avro import request_codec
from pipeline.codecs.keys import content_hash
from pipeline.codecs.registry import RegistryClient, frame_header, subject_of
from pipeline.errors import (
    BrokerUnavailable,
    ConfigurationError,
    PipelineError,
    PublishError,
    ValidationError,
)
from pipeline.kafka.reader import Answer, read_answers
from pipeline.kafka.security import AuthWatch, client_config, connect
from pipeline.observability.logs import LibrdkafkaLog
from pipeline.settings import LANES, PREFIX, Settings
from pipeline.worker.records import MAX_REQUEST_ID_CHARS

BOOTSTRAP_VAR = f"{PREFIX}KAFKA_BOOTSTRAP_SERVERS"

__all__ = [
    "Answer",
    "RequestProducer",
    "check_request",
    "read_answers",
    "request_bytes",
    "require_bootstrap",
]

#: How :class:`RequestProducer` frames requests.
FRAMINGS = ("single-object", "registry")


def request_bytes(
    text: str,
    *,
    request_id: str | None = None,
    created_at_ms: int | None = None,
    deadline_ms: int | None = None,
    source: str = "",
    metadata: Mapping[str, str] | None = None,
    header: bytes | None = None,
) -> tuple[str, bytes]:
    """Encode an InferenceRequest; return ``(request_id, value)``. ``header`` replaces
    the single-object header (the registry's: :func:`pipeline.codecs.registry.frame_header`)."""
    rid = request_id or uuid.uuid4().hex
    value = request_codec().encode(
        {
            "request_id": rid,
            "text": text,
            "created_at_ms": int(time.time() * 1000) if created_at_ms is None else created_at_ms,
            "deadline_ms": deadline_ms,
            "source": source,
            "metadata": dict(metadata or {}),
        },
        header=header,
    )
    return rid, value


def require_bootstrap(settings: Settings) -> str:
    """The bootstrap address, or ConfigurationError naming the setting when empty."""
    boot = settings.kafka.bootstrap_servers.strip()
    if not boot:
        raise ConfigurationError(
            f"{BOOTSTRAP_VAR} is empty; set it to the brokers' host:port[,...]"
        )
    return boot


def check_request(
    settings: Settings, text: object, request_id: object, deadline_ms: object
) -> None:
    """Raise ValidationError for a request a worker would dead-letter at ``validate``."""
    if request_id is not None and not (
        isinstance(request_id, str) and 0 < len(request_id) <= MAX_REQUEST_ID_CHARS
    ):
        raise ValidationError(
            f"request_id must be a string of 1-{MAX_REQUEST_ID_CHARS} characters, "
            f"got {request_id!r:.60}"
        )
    rid = request_id if isinstance(request_id, str) else None
    if not isinstance(text, str):
        raise ValidationError(f"text must be a string, got {text!r:.60}", request_id=rid)
    if not text.strip():
        raise ValidationError("text is empty", request_id=rid)
    cap = settings.validation.max_text_chars
    if len(text) > cap:
        raise ValidationError(
            f"text of {len(text)} characters exceeds the cap of {cap} "
            f"({PREFIX}VALIDATION_MAX_TEXT_CHARS)",
            request_id=rid,
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError("text is not valid Unicode", request_id=rid) from None
    if deadline_ms is not None and (
        isinstance(deadline_ms, bool) or not isinstance(deadline_ms, int)
    ):
        raise ValidationError(
            f"deadline_ms must be an integer (epoch ms), got {deadline_ms!r:.60}", request_id=rid
        )


class _ProducerIdWatch(LibrdkafkaLog):
    """The producer's log: notes when its idempotent producer id is assigned."""

    def __init__(self) -> None:
        super().__init__()
        self.assigned = False

    def seen(self, line: str) -> None:
        if "Idempotent producer state change" in line:
            self.assigned = line.rstrip().endswith("-> Assigned")


class RequestProducer:
    """Produces InferenceRequests to the lane topics; ``flush`` waits for every ack.

    The constructor connects (see :meth:`connect`) before it returns, unless
    ``connect_timeout_s`` is None: a request sent right after construction does
    not wait for the connection, and a wrong address, missing lane topics or
    refused credentials fail here, in one line, instead of at the first flush.

    ``framing="registry"`` sends requests in the Confluent Schema Registry's
    framing: the current InferenceRequest schema is registered under each lane
    topic's ``<topic>-value`` subject when the producer is made (a registry
    that refuses or does not answer is a ConfigurationError then).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        source: str = "pipeline.kafka.client",
        connect_timeout_s: float | None = 10.0,
        framing: str = "single-object",
    ) -> None:
        self.settings = settings
        self.source = source
        self._headers = self._register(framing)
        self._errors: list[str] = []
        self.acked = 0
        #: Epoch ms when this producer was made: its requests' answers come after it.
        self.started_ms = int(time.time() * 1000)
        self._watch = AuthWatch(settings)
        self._pid = _ProducerIdWatch()
        self._producer = Producer(
            {
                **client_config(settings, self._watch),
                "logger": self._pid,
                "debug": "eos",  # a few lines per producer: its idempotence state changes
                "client.id": settings.kafka.client_id + "-producer",
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "partitioner": "murmur2_random",
                "message.timeout.ms": 30000,
                # A typo in the topic prefix must not create topics with the broker's
                # default partition count: connect() checks the lanes exist instead.
                "allow.auto.create.topics": False,
            }
        )
        if connect_timeout_s is not None:
            self.connect(connect_timeout_s)

    def _register(self, framing: str) -> dict[str, bytes | None]:
        """Each lane's frame header: None (single-object), or the registry's."""
        if framing not in FRAMINGS:
            raise ConfigurationError(f"framing {framing!r}: expected one of {', '.join(FRAMINGS)}")
        if framing == "single-object":
            return dict.fromkeys(LANES)
        reg = self.settings.registry
        if not reg.enabled:
            raise ConfigurationError(
                f"registry framing needs the Schema Registry's address: set {PREFIX}REGISTRY_URL"
            )
        client = RegistryClient(reg)
        text = request_codec().current.path.read_text(encoding="utf-8")
        headers: dict[str, bytes | None] = {}
        for lane in LANES:
            subject = subject_of(self.settings.topics.lane_topic(lane))
            try:
                headers[lane] = frame_header(client.register(subject, text))
            except PipelineError as exc:
                raise ConfigurationError(
                    f"cannot register InferenceRequest under {subject} at {reg.url}: {exc}"
                ) from exc
        return headers

    def connect(self, timeout_s: float = 10.0) -> None:
        """Connect to the cluster now, so the first requests do not wait for it.

        A new producer connects (and, idempotent, gets its producer id) on its
        first send: measured here, that first acknowledgement took 100-500 ms,
        against under 1 ms once connected. Waits for the lane topics' metadata
        and the producer id as well. Raises :class:`BrokerUnavailable` when no
        broker answers within ``timeout_s`` (naming the address and its
        setting), :class:`ConfigurationError` when a lane topic is missing,
        AuthenticationFailed when the broker refuses this client.
        """
        boot = require_bootstrap(self.settings)
        try:
            meta = connect(self._producer, self._watch, timeout_s)
        except BrokerUnavailable as exc:
            raise BrokerUnavailable(
                f"no broker answered within {timeout_s}s at {boot} "
                f"({self._watch.last_error or 'no reply'}); check {BOOTSTRAP_VAR}, or start "
                "a local broker with `pipeline kafka up`"
            ) from exc
        lanes = [self.settings.topics.lane_topic(lane) for lane in LANES]
        missing = [t for t in lanes if t not in meta.topics]
        if missing:
            raise ConfigurationError(
                f"lane topic(s) {', '.join(missing)} do not exist at {boot}; create them with "
                f"`pipeline topics create`, or check {PREFIX}TOPICS_PREFIX "
                f"({self.settings.topics.prefix!r})"
            )
        # librdkafka holds every record until the producer id is assigned, and retries
        # a refused request for it (a broker still loading its coordinator) only after
        # 500 ms: wait for it here, not in the first request's deadline.
        deadline = time.monotonic() + timeout_s
        while not self._pid.assigned and time.monotonic() < deadline:
            self._producer.poll(0.02)
            self._watch.check()

    def answers(
        self, request_ids: Iterable[str], *, timeout_s: float | None = 60.0
    ) -> Iterator[Answer]:
        """Yield the answer (result or dead letter) to each of ``request_ids``, as
        they come; stops once each has one, or at ``timeout_s``.

        Reads from this producer's start (less a minute, for clocks that differ
        between hosts), not from the topics' beginning.
        """
        start = self.started_ms - 60_000
        yield from read_answers(
            self.settings, request_ids=list(request_ids), start=start, timeout_s=timeout_s
        )

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
        """Queue one request for ``lane``; return its request_id.

        Raises ValidationError, before sending, for what a worker would only
        dead-letter: an unknown lane, an empty text, a text over
        ``PIPELINE_VALIDATION_MAX_TEXT_CHARS``, a record over
        ``PIPELINE_VALIDATION_MAX_PAYLOAD_BYTES``, a request id that is not a
        string of 1-256 characters, a deadline that is not an integer.
        """
        if lane not in LANES:
            raise ValidationError(f"unknown lane {lane!r}; expected one of {', '.join(LANES)}")
        check_request(self.settings, text, request_id, deadline_ms)
        rid, value = request_bytes(
            text,
            request_id=request_id,
            deadline_ms=deadline_ms,
            source=self.source,
            metadata=metadata,
            header=self._headers[lane],
        )
        cap = self.settings.validation.max_payload_bytes
        if len(value) > cap:
            raise ValidationError(
                f"request of {len(value)} bytes exceeds the cap of {cap} "
                f"({PREFIX}VALIDATION_MAX_PAYLOAD_BYTES)",
                request_id=rid,
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
