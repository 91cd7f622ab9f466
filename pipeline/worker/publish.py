"""Results and dead letters out, each awaited until the broker acknowledges it.

Commit order, enforced by the worker with this module's help:
publish the result or dead letter, wait for the broker's acknowledgement,
store the dedupe entry, then release the input offset (in offset order).

The records are built here (a dead letter's copy of its input is bounded);
the producer that sends them is :mod:`pipeline.kafka.producer`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import random
import socket
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from pipeline.codecs.avro import HEADER_LEN, dead_letter_codec, result_codec
from pipeline.codecs.registry import AnswerHeaders
from pipeline.errors import AnswerPathFailure, PublishRejected
from pipeline.inference import Prediction
from pipeline.settings import RetrySettings
from pipeline.worker.records import Origin, Request

__all__ = [
    "DEAD_LETTER_KEY_PREFIX",
    "DEAD_LETTER_VALUE_PREFIX",
    "FatalFn",
    "Publisher",
    "SendFn",
    "backoff_ms",
    "dead_letter_record",
    "result_record",
]

log = logging.getLogger(__name__)

#: Sends one record and returns an awaitable that resolves on the broker's ack.
SendFn = Callable[[str, bytes | None, bytes], Awaitable[Awaitable[Any]]]
#: Hands one record to the producer at once: the acknowledgement to await; raises
#: BufferError (nothing queued) while the producer's queue is full.
SendNowFn = Callable[[str, bytes | None, bytes], Awaitable[Any]]
#: Stops the worker loudly; called once, with the failure that stopped the answer path.
FatalFn = Callable[[BaseException], None]

#: A dead letter copies at most this many bytes of its input's value (every valid
#: request fits: validation's payload limit is 64 KiB); a longer value is cut and
#: the dead letter carries its length and sha256 instead, so replay re-reads it
#: from the lane topic. With the key's bound, the error message's 2,000
#: characters and the request id's 256, a dead letter stays under 90 KiB: far
#: below the answer producer's 1,000,000-byte limit.
DEAD_LETTER_VALUE_PREFIX = 65_536
#: The same for the input's key (which is also the dead letter's record key).
DEAD_LETTER_KEY_PREFIX = 1_024

WORKER_NAME = f"{socket.gethostname()}:{os.getpid()}"


def backoff_ms(attempt: int, retry: RetrySettings, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter for the given 1-based attempt."""
    cap = min(retry.backoff_max_ms, retry.backoff_base_ms * 2 ** (attempt - 1))
    return (rng or random).uniform(0, cap)


def result_record(
    request: Request,
    prediction: Prediction,
    *,
    model_name: str,
    model_version: str,
    task: str,
    served: str,
    completed_at_ms: int,
    queue_ms: float = 0.0,
    inference_ms: float = 0.0,
    batch_size: int = 0,
) -> dict[str, Any]:
    """The InferenceResult record answering ``request``."""
    return {
        "request_id": request.request_id,
        "content_hash": request.content_hash,
        "model_name": model_name,
        "model_version": model_version,
        "task": task,
        "priority": request.lane,
        "embedding": prediction.embedding,
        "label": prediction.label,
        "score": prediction.score,
        "served": served,
        "created_at_ms": request.created_at_ms,
        "completed_at_ms": completed_at_ms,
        "queue_ms": float(queue_ms),
        "inference_ms": float(inference_ms),
        "batch_size": batch_size,
        "metadata": request.metadata,
    }


def dead_letter_record(
    origin: Origin,
    *,
    stage: str,
    error: BaseException,
    attempts: int,
    failed_at_ms: int,
    request_id: str | None,
) -> dict[str, Any]:
    """The DeadLetter record for an input: its coordinates, and its bytes untouched
    up to :data:`DEAD_LETTER_VALUE_PREFIX` (:data:`DEAD_LETTER_KEY_PREFIX` for the
    key). A value cut short carries ``value_length`` and ``value_sha256`` of the
    whole; a key cut short, ``key_length``."""
    key, value = origin.key, origin.value
    long_value = value if value is not None and len(value) > DEAD_LETTER_VALUE_PREFIX else None
    long_key = key if key is not None and len(key) > DEAD_LETTER_KEY_PREFIX else None
    return {
        "original_topic": origin.topic,
        "original_partition": origin.partition,
        "original_offset": origin.offset,
        "original_timestamp_ms": origin.timestamp_ms,
        "key": key if long_key is None else long_key[:DEAD_LETTER_KEY_PREFIX],
        "value": value if long_value is None else long_value[:DEAD_LETTER_VALUE_PREFIX],
        "value_length": None if long_value is None else len(long_value),
        "value_sha256": None if long_value is None else hashlib.sha256(long_value).hexdigest(),
        "key_length": None if long_key is None else len(long_key),
        "stage": stage,
        "error_class": type(error).__name__,
        "error_message": str(error)[:2000],
        "attempts": attempts,
        "failed_at_ms": failed_at_ms,
        "request_id": request_id[:256] if request_id is not None else None,
        "worker": WORKER_NAME,
    }


class Publisher:
    """Sends results and dead letters and waits for the broker's acknowledgement.

    It never resends: the producer behind ``send`` retries on its own
    (librdkafka, idempotent, within a bounded delivery time). A send either
    is acknowledged, or fails definitely (:class:`PublishRejected`: surely not
    written; a result may then become a dead letter), or fails in any other way
    (:class:`AnswerPathFailure`: maybe written). The latter, and a dead letter
    that is refused, call ``on_fatal`` (which stops the worker) and raise
    :class:`AnswerPathFailure`: the input stays unreleased, so it is delivered
    again after the restart, and never gets both a result and a dead letter.
    """

    def __init__(
        self,
        send: SendFn,
        *,
        results_topic: str,
        dlq_topic: str,
        on_fatal: FatalFn | None = None,
        send_nowait: SendNowFn | None = None,
        headers: AnswerHeaders | None = None,
    ) -> None:
        self._send = send
        #: The Confluent framing's headers (PIPELINE_REGISTRY_ANSWER_FRAMING=registry), or
        #: None: Avro single-object encoding. Either way the bytes a result's dedupe entry
        #: stores are single-object encoded.
        self._headers = headers
        self._send_nowait = send_nowait
        self.results_topic = results_topic
        self.dlq_topic = dlq_topic
        #: Stops the worker; the runtime binds it to its events when none was given.
        self.on_fatal = on_fatal
        self.failure: AnswerPathFailure | None = None

    def fail(self, failure: BaseException) -> AnswerPathFailure:
        """Stop the worker loudly (once) because of ``failure``; return it as the
        pipeline's error, for the caller to raise."""
        if not isinstance(failure, AnswerPathFailure):
            wrapped = AnswerPathFailure(f"{type(failure).__name__}: {failure}")
            wrapped.__cause__ = failure
            failure = wrapped
        assert isinstance(failure, AnswerPathFailure)
        if self.failure is None:
            self.failure = failure
            log.critical(
                "the answer path failed (%s); stopping the worker: inputs not yet answered "
                "stay uncommitted and are delivered again after a restart",
                failure,
            )
            if self.on_fatal is not None:
                self.on_fatal(failure)
        return failure

    async def _send_acked(self, topic: str, key: bytes | None, value: bytes) -> None:
        try:
            ack = await self._send(topic, key, value)
            await ack
        except (asyncio.CancelledError, PublishRejected):
            raise
        except Exception as exc:
            raise self.fail(exc) from exc

    def result_begin(
        self, key: bytes | None, record: dict[str, Any]
    ) -> tuple[bytes, Coroutine[Any, Any, None]]:
        """Encode a result and hand it to the producer now, when it has room; return its
        bytes and the acknowledgement to await. So a batch's results all go out before
        the first acknowledgement is awaited.

        Raises PublishRejected at once when the result cannot be encoded; the
        acknowledgement raises PublishRejected (not written: answer with a dead letter)
        or AnswerPathFailure (the worker is stopping; leave the input unreleased).
        """
        try:
            value = result_codec().encode(record)
        except Exception as exc:  # nothing was sent: a definite failure
            raise PublishRejected(f"cannot encode the result: {type(exc).__name__}: {exc}") from exc
        wire = self._framed(value)
        if self._send_nowait is not None:
            try:
                return value, self._acked(self._send_nowait(self.results_topic, key, wire))
            except BufferError:  # the producer's queue is full: wait for room when awaited
                pass
        return value, self._send_acked(self.results_topic, key, wire)

    def _framed(self, value: bytes) -> bytes:
        """A single-object-encoded result as it goes to the results topic."""
        if self._headers is None:
            return value
        return self._headers.result + value[HEADER_LEN:]

    async def _acked(self, ack: Awaitable[Any]) -> None:
        try:
            await ack
        except (asyncio.CancelledError, PublishRejected):
            raise
        except Exception as exc:
            raise self.fail(exc) from exc

    async def dead_letter(self, record: dict[str, Any]) -> None:
        """Publish a dead letter, keyed like its input, and wait for the acknowledgement.

        Raises AnswerPathFailure when it is not acknowledged, for whatever reason.
        """
        try:
            header = None if self._headers is None else self._headers.dead_letter
            value = dead_letter_codec().encode(record, header=header)
            await self._send_acked(self.dlq_topic, record.get("key"), value)
        except PublishRejected as exc:
            raise self.fail(AnswerPathFailure(f"dead letter refused: {exc}")) from exc
