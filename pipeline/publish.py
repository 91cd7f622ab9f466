"""Results and dead letters out, each awaited until the broker acknowledges it.

Commit order, enforced by the worker with this module's help:
publish the result or dead letter, wait for the broker's acknowledgement,
store the dedupe entry, then release the input offset (in offset order).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pipeline.codec import dead_letter_codec, result_codec
from pipeline.errors import PublishError
from pipeline.inference import Prediction
from pipeline.intake import Request
from pipeline.settings import RetrySettings

__all__ = ["Origin", "Publisher", "SendFn", "backoff_ms", "dead_letter_record", "result_record"]

log = logging.getLogger(__name__)

#: Sends one record and returns an awaitable that resolves on the broker's ack.
SendFn = Callable[[str, bytes | None, bytes], Awaitable[Awaitable[Any]]]

WORKER_NAME = f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Origin:
    """Where an input came from: enough to find and replay it."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None


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
    """The DeadLetter record for an input, with its bytes untouched."""
    return {
        "original_topic": origin.topic,
        "original_partition": origin.partition,
        "original_offset": origin.offset,
        "original_timestamp_ms": origin.timestamp_ms,
        "key": origin.key,
        "value": origin.value,
        "stage": stage,
        "error_class": type(error).__name__,
        "error_message": str(error)[:2000],
        "attempts": attempts,
        "failed_at_ms": failed_at_ms,
        "request_id": request_id,
        "worker": WORKER_NAME,
    }


class Publisher:
    """Sends results and dead letters and waits for the broker's acknowledgement.

    A send that fails is retried ``retry.max_attempts`` times with backoff;
    then :class:`PublishError` is raised and the caller must not acknowledge
    the input.
    """

    def __init__(
        self, send: SendFn, *, results_topic: str, dlq_topic: str, retry: RetrySettings
    ) -> None:
        self._send = send
        self.results_topic = results_topic
        self.dlq_topic = dlq_topic
        self._retry = retry

    async def _send_acked(self, topic: str, key: bytes | None, value: bytes) -> None:
        for attempt in range(1, self._retry.max_attempts + 1):
            try:
                ack = await self._send(topic, key, value)
                await ack
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if attempt == self._retry.max_attempts:
                    raise PublishError(
                        f"{topic}: not acknowledged after {attempt} attempts: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                delay = backoff_ms(attempt, self._retry) / 1000
                log.warning("publish to %s failed (%s); retrying in %.2fs", topic, exc, delay)
                await asyncio.sleep(delay)

    async def result(self, key: bytes | None, record: dict[str, Any]) -> bytes:
        """Publish a result; return its encoded bytes once acknowledged."""
        value = result_codec().encode(record)
        await self._send_acked(self.results_topic, key, value)
        return value

    async def result_bytes(self, key: bytes | None, value: bytes) -> None:
        """Publish an already-encoded result and wait for the acknowledgement."""
        await self._send_acked(self.results_topic, key, value)

    async def dead_letter(self, record: dict[str, Any]) -> None:
        """Publish a dead letter, keyed like its input, and wait for the acknowledgement."""
        value = dead_letter_codec().encode(record)
        await self._send_acked(self.dlq_topic, record.get("key"), value)
