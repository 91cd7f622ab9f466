"""Results and dead letters out through librdkafka (confluent-kafka), bridged to asyncio.

Promises:

- One idempotent producer (``enable.idempotence``, ``acks=all``), lingering
  ``worker.producer_linger_ms``, with the security options of every other
  client (:func:`pipeline.kafka.security.client_config`), an explicit largest record
  (:data:`MAX_MESSAGE_BYTES`, below the broker's default limit) and an
  explicit delivery bound (``worker.answer_timeout_ms``).
- :meth:`AnswerProducer.send` returns a future that resolves on the event loop
  once the broker has acknowledged the record, or fails with
  :class:`~pipeline.errors.PublishRejected` when the record was surely not
  written (too large, topic not authorised, invalid) or with
  :class:`~pipeline.errors.AnswerPathFailure` when its fate is unknown (the
  delivery timed out) or the producer is broken (a fatal error).
- Python never resends a record: librdkafka retries within the delivery bound,
  and its idempotence keeps those retries from writing a record twice.
- Delivery reports are collected by one thread that calls ``poll()`` in a loop
  and handed to the event loop with one ``call_soon_threadsafe`` per poll that
  returned any, never one per record.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from pipeline.errors import AnswerPathFailure, PublishRejected
from pipeline.kafka.security import AuthWatch, client_config
from pipeline.settings import Settings

__all__ = [
    "BROKER_MAX_MESSAGE_BYTES",
    "MAX_MESSAGE_BYTES",
    "RETRIED",
    "AnswerProducer",
    "classify",
]

log = logging.getLogger(__name__)

#: The broker's default ``max.message.bytes``: the largest record a lane topic takes
#: unless its configuration says otherwise (``pipeline.kafka.topics`` leaves it alone).
BROKER_MAX_MESSAGE_BYTES = 1_048_588

#: The largest record the answer producer sends (librdkafka's ``message.max.bytes``).
#: It stays below :data:`BROKER_MAX_MESSAGE_BYTES`, and a dead letter is built to stay
#: far below it (see ``pipeline.worker.publish``).
MAX_MESSAGE_BYTES = 1_000_000

#: Errors after which the record was surely not written: the input may be dead-lettered.
#: The broker or the client refused this record itself, for good (docs/design.md,
#: "What a failed produce means"); a retry would be refused again.
_DEFINITE = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,  # over the topic's max.message.bytes
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_RECORD,  # the broker's record validation
        KafkaError.INVALID_MSG,  # CORRUPT_MESSAGE: failed its CRC at the broker
        KafkaError.INVALID_TIMESTAMP,  # outside the topic's timestamp bounds
        KafkaError.POLICY_VIOLATION,  # refused by a broker-side policy
        KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT,
        KafkaError.TOPIC_EXCEPTION,  # not a valid topic name
        KafkaError._INVALID_ARG,  # refused by librdkafka before it was queued
        KafkaError._KEY_SERIALIZATION,
        KafkaError._VALUE_SERIALIZATION,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
    }
)

#: Errors librdkafka retries by itself (idempotently, within message.timeout.ms): a
#: delivery report never carries one; past the timeout it says _MSG_TIMED_OUT, whose
#: fate is unknown. Listed for the table and its test, not consulted.
RETRIED = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.KAFKA_STORAGE_ERROR,
        KafkaError.NOT_CONTROLLER,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
    }
)

_POLL_S = 0.05


def classify(err: KafkaError, topic: str) -> PublishRejected | AnswerPathFailure:
    """The pipeline's error for a failed delivery: a definite refusal of this record
    (rejected: the input is dead-lettered and released), or of unknown fate (a
    timeout, a fatal producer error, any error not known to be a refusal: the worker
    stops and the input stays uncommitted)."""
    text = f"{topic}: {err.name()}: {err.str()}"
    if err.code() in _DEFINITE and not err.fatal():
        return PublishRejected(f"{text} (refused; not written)")
    return AnswerPathFailure(f"{text} (the record may or may not be written)")


Report = tuple["asyncio.Future[int]", KafkaError | None, str, int]


class AnswerProducer:
    """The worker's one producer of results and dead letters (see the module's promises).

    ``on_fatal`` is called on the event loop when librdkafka reports a fatal
    error that belongs to no single record.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        on_fatal: Callable[[BaseException], None],
        extra: dict[str, Any] | None = None,
    ) -> None:
        self._on_fatal = on_fatal
        self._watch = AuthWatch(settings)
        self.config: dict[str, Any] = {
            **client_config(settings),
            "error_cb": self._error,
            "client.id": settings.kafka.client_id + "-answers",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": settings.worker.producer_linger_ms,
            "message.max.bytes": MAX_MESSAGE_BYTES,
            # Retries included: a broker restart shorter than this goes unnoticed; past
            # it the record's fate is unknown and the worker stops (input redelivered).
            "message.timeout.ms": settings.worker.answer_timeout_ms,
            # The Java client's partitioner: a result lands where Java clients expect.
            "partitioner": "murmur2_random",
            **(extra or {}),
        }
        self._producer = Producer(self.config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._reports: list[Report] = []  # touched only by the polling thread
        self.outstanding = 0  # sent, not yet reported (event loop only)

    def start(self) -> None:
        """Start the polling thread; call from the event loop that awaits the sends."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._poll_forever, name="answer-producer")
        self._thread.daemon = True
        self._thread.start()

    async def send(
        self, topic: str, key: bytes | None, value: bytes, partition: int | None = None
    ) -> asyncio.Future[int]:
        """Hand one record to librdkafka; return the future of its acknowledgement
        (its offset), waiting while librdkafka's queue is full.

        A record refused before it is queued (too large for
        :data:`MAX_MESSAGE_BYTES`, say) gives a future that has already failed.
        """
        while True:
            try:
                return self.send_nowait(topic, key, value, partition)
            except BufferError:  # librdkafka's queue is full: not queued, safe to try again
                await asyncio.sleep(_POLL_S)

    def send_nowait(
        self, topic: str, key: bytes | None, value: bytes, partition: int | None = None
    ) -> asyncio.Future[int]:
        """As :meth:`send`, from synchronous code: raises BufferError (nothing queued)
        while librdkafka's queue is full."""
        # The loop start() was given: asyncio.get_running_loop() makes a getpid() system
        # call each time on Python 3.11, 2.8 % of a busy worker's event loop (py-spy).
        loop = self._loop or asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        callback = functools.partial(self._delivered, fut, topic)
        try:
            if partition is None:
                self._producer.produce(topic, value, key, on_delivery=callback)
            else:
                self._producer.produce(topic, value, key, partition, on_delivery=callback)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            fut.set_exception(
                classify(err, topic)
                if isinstance(err, KafkaError)
                else AnswerPathFailure(f"{topic}: {exc}")
            )
            return fut
        self.outstanding += 1
        return fut

    def produce_nowait(
        self,
        topic: str,
        key: bytes,
        value: bytes,
        partition: int,
        on_delivery: Callable[[KafkaError | None, Any], None],
    ) -> None:
        """Hand one record to librdkafka without a future: ``on_delivery(err, msg)`` runs
        on the polling thread (keep it short; it must not touch the event loop). For
        records nobody awaits (the dedupe changelog); raises BufferError (nothing
        queued) while librdkafka's queue is full, KafkaException when refused."""
        self._producer.produce(topic, value, key, partition, on_delivery=on_delivery)

    def _delivered(
        self, fut: asyncio.Future[int], topic: str, err: KafkaError | None, msg: Any
    ) -> None:
        offset = -1 if err is not None else msg.offset()
        self._reports.append((fut, err, topic, offset))  # on the polling thread, in poll()

    def _poll_forever(self) -> None:
        producer, loop = self._producer, self._loop
        assert loop is not None
        while not self._stop.is_set():
            producer.poll(_POLL_S)
            if self._reports:
                reports, self._reports = self._reports, []
                try:
                    loop.call_soon_threadsafe(self._settle, reports)
                except RuntimeError:  # the loop is closed: nobody waits any more
                    return

    def _settle(self, reports: list[Report]) -> None:
        """On the event loop: resolve one poll's worth of delivery reports."""
        self.outstanding -= len(reports)
        for fut, err, topic, offset in reports:
            if fut.done():
                continue
            if err is None:
                fut.set_result(offset)
            else:
                fut.set_exception(classify(err, topic))

    def _error(self, err: KafkaError) -> None:
        """librdkafka's error callback (on the polling thread)."""
        self._watch(err)
        if not err.fatal():
            log.warning("answer producer: %s", err.str())
            return
        failure = AnswerPathFailure(f"answer producer: fatal error {err.name()}: {err.str()}")
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._on_fatal, failure)

    def close(self, timeout_s: float = 10.0) -> int:
        """Stop polling, wait up to ``timeout_s`` for outstanding records; return how
        many were left unacknowledged (their inputs stay uncommitted). Blocking:
        run it off the event loop, after the awaiting tasks are done or cancelled."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        left = int(self._producer.flush(timeout_s))  # its reports land in self._reports
        reports, self._reports = self._reports, []
        if reports and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._settle, reports)
        return left
