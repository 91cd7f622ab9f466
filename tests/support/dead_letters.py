"""Dead-letter records for tests: one builder, instead of the record written out by hand
in each test module."""

from __future__ import annotations

from typing import Any

from pipeline.errors import InferenceError, stage_of
from pipeline.worker.publish import dead_letter_record
from pipeline.worker.records import Origin

__all__ = ["dead_letter_dict"]


def dead_letter_dict(
    error: BaseException | None = None,
    *,
    original_topic: str = "inference.requests.bulk",
    original_partition: int = 0,
    original_offset: int = 0,
    original_timestamp_ms: int = 1_000,
    key: bytes | None = b"k",
    value: bytes | None = b"\x00v",
    stage: str | None = None,
    attempts: int = 1,
    failed_at_ms: int = 2_000,
    request_id: str | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """A DeadLetter record of the current schema, made as the worker makes one: by
    :func:`pipeline.worker.publish.dead_letter_record`, from an
    :class:`~pipeline.worker.records.Origin` and a real
    ``error`` (``InferenceError("model raised")`` when omitted).

    The keyword arguments are the record's fields. ``stage`` is the error's own stage
    unless given; ``overrides`` (``worker``, ``error_class``, ``value_length``, ...)
    replace fields of the record once it is made, and must name fields it has.
    """
    if error is None:
        error = InferenceError("model raised")
    if stage is None:
        stage = stage_of(error)
    origin = Origin(
        original_topic, original_partition, original_offset, original_timestamp_ms, key, value
    )
    record = dead_letter_record(
        origin,
        stage=stage,
        error=error,
        attempts=attempts,
        failed_at_ms=failed_at_ms,
        request_id=request_id,
    )
    unknown = set(overrides) - set(record)
    if unknown:
        raise TypeError(f"not fields of a DeadLetter record: {sorted(unknown)}")
    return {**record, **overrides}
