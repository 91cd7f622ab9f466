"""Intake: raw bytes from a lane topic to a validated :class:`Request`.

Promises: :func:`parse` returns a Request or raises DecodeError (stage
``decode``) or ValidationError (stage ``validate``); it never raises anything
else, whatever the bytes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pipeline.codecs.avro import HEADER_LEN, MARKER, request_codec
from pipeline.codecs.keys import InputKeys, content_hash
from pipeline.codecs.reader import read_long
from pipeline.codecs.registry import FRAME_LEN, MAGIC, split_frame
from pipeline.errors import DecodeError, RetryableError, ValidationError
from pipeline.settings import ValidationSettings
from pipeline.worker.records import MAX_REQUEST_ID_CHARS, Request

__all__ = ["parse", "peek_request_id"]

_JSON_ID = re.compile(rb'"request_id"\s*:\s*"([^"\\\x00-\x1f]{1,256})"')


def peek_request_id(value: bytes, writer_of: Callable[[int], Any] | None = None) -> str | None:
    """The request id of a record too large to decode, read from its first bytes
    (Avro: the first field; in the Schema Registry's framing, given ``writer_of``, when
    the writer's schema, already known, starts with a string ``request_id``; JSON: a
    plain ``"request_id": "..."`` near the start), or None. Reads at most a few hundred
    bytes of Avro and 4 KiB of JSON."""
    try:
        if value.startswith(MARKER):
            return _leading_id(value, HEADER_LEN)
        if value[:1] == MAGIC and writer_of is not None:
            try:
                fields = writer_of(split_frame(value)).get("fields") or [{}]
            except (DecodeError, RetryableError):  # unknown or not looked up yet: no guess
                return None
            if fields[0].get("name") == "request_id" and fields[0].get("type") == "string":
                return _leading_id(value, FRAME_LEN)
        elif value.startswith(b"{"):
            match = _JSON_ID.search(value[:4096])
            if match:
                return match.group(1).decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None


def _leading_id(value: bytes, pos: int) -> str | None:
    """The Avro string at ``pos`` of ``value`` if it is a plausible request id, or None."""
    try:
        size, pos = read_long(value, pos)
    except (IndexError, ValueError):  # cut short, or no varint
        return None
    if 0 < size <= MAX_REQUEST_ID_CHARS * 4 and pos + size <= len(value):
        rid = value[pos : pos + size].decode("utf-8")
        return rid if len(rid) <= MAX_REQUEST_ID_CHARS else None
    return None


def parse(
    value: bytes | None,
    *,
    lane: str,
    lane_deadline_ms: int,
    model_id: str,
    limits: ValidationSettings,
    received_at_ms: int,
    keys: Callable[[str], str] | None = None,
    writer_of: Callable[[int], Any] | None = None,
) -> Request:
    """Decode and validate one lane record (see the module's promise).

    The record may be Avro single-object encoded, a JSON object, or Avro in the
    Confluent Schema Registry's framing (told apart by its first bytes,
    :meth:`pipeline.codecs.avro.Codec.decode_any`; ``writer_of`` gives a registry
    schema id's writer schema, :meth:`pipeline.worker.writer_schemas.WriterSchemas.writer`);
    all are checked by the same rules below. ``keys`` computes the dedupe key (the
    model's :class:`~pipeline.codecs.keys.InputKeys`); without it texts dedupe only when equal.
    """
    if value is not None and len(value) > limits.max_payload_bytes:
        raise ValidationError(
            f"payload of {len(value)} bytes exceeds the cap of {limits.max_payload_bytes}",
            request_id=peek_request_id(value, writer_of),
        )
    try:
        record = request_codec().decode_any(value, writer_of)
    except (DecodeError, ValidationError):
        raise
    except Exception as exc:  # belt and braces: nothing else may escape
        raise DecodeError(f"{type(exc).__name__}: {exc}") from exc

    request_id = record["request_id"]
    text = record["text"]
    if not request_id:
        raise ValidationError("request_id is empty")
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        raise ValidationError(f"request_id longer than {MAX_REQUEST_ID_CHARS} characters")
    if not text.strip():
        raise ValidationError("text is empty", request_id=request_id)
    if len(text) > limits.max_text_chars:
        raise ValidationError(
            f"text of {len(text)} characters exceeds the cap of {limits.max_text_chars}",
            request_id=request_id,
        )
    created = int(record["created_at_ms"]) or received_at_ms
    deadline = record["deadline_ms"]
    default_deadline = created + lane_deadline_ms
    # A request's own deadline may shorten the lane's default, never lengthen it.
    deadline_ms = default_deadline if deadline is None else min(int(deadline), default_deadline)
    return Request(
        request_id=request_id,
        text=text,
        created_at_ms=created,
        deadline_ms=deadline_ms,
        lane=lane,
        content_hash=content_hash(text, model_id),
        dedupe_key=(keys or InputKeys(model_id))(text),
        source=record.get("source", ""),
        metadata=dict(record.get("metadata") or {}),
    )
