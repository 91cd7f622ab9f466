"""JSON requests on lane topics: decoded as strictly as Avro, by the same intake rules."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.codecs.avro import HEADER_LEN, request_codec
from pipeline.codecs.registry import MAGIC
from pipeline.errors import (
    DecodeError,
    PermanentError,
    RegistryUnavailable,
    UnknownSchemaId,
    ValidationError,
)
from pipeline.kafka.client import request_bytes
from pipeline.settings import ValidationSettings
from pipeline.worker.intake import parse, peek_request_id

LIMITS = ValidationSettings()


def _parse(value: bytes, limits: ValidationSettings = LIMITS) -> object:
    return parse(
        value,
        lane="standard",
        lane_deadline_ms=1_000,
        model_id="m",
        limits=limits,
        received_at_ms=5_000,
    )


def _json(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_a_json_request_is_the_same_request_as_its_avro_twin() -> None:
    _, avro = request_bytes("héllo", request_id="r1", created_at_ms=4_000, deadline_ms=4_500)
    as_json = _json(request_id="r1", text="héllo", created_at_ms=4_000, deadline_ms=4_500)
    both = _parse(avro), _parse(as_json)
    assert both[0] == both[1]
    minimal = _parse(_json(request_id="r2", text="hi"))
    assert minimal.created_at_ms == 5_000 and minimal.deadline_ms == 6_000  # type: ignore[attr-defined]
    assert minimal.source == "" and minimal.metadata == {}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (b"{not json", DecodeError, "not a JSON object"),
        (b'{"request_id": "a", "text": "\xff"}', DecodeError, "not valid UTF-8"),
        (b"{}[]", DecodeError, "not a JSON object"),
        (_json(request_id=7, text="x"), ValidationError, "field 'request_id': expected a string"),
        (_json(request_id="a"), ValidationError, "field 'text' is missing"),
        (
            _json(request_id="a", text="x", deadline="1"),
            ValidationError,
            "unknown field 'deadline'",
        ),
        (
            _json(request_id="a", text="x", deadline_ms="soon"),
            ValidationError,
            "field 'deadline_ms': expected null or long, got a string",
        ),
        (
            _json(request_id="a", text="x", created_at_ms=True),
            ValidationError,
            r"field 'created_at_ms': expected an integer \(long\), got a boolean",
        ),
        (
            _json(request_id="a", text="x", created_at_ms=2**63),
            ValidationError,
            "field 'created_at_ms': 9223372036854775808 is out of the long range",
        ),
        (
            _json(request_id="a", text="x", metadata={"k": 1}),
            ValidationError,
            "field 'metadata': key 'k': expected a string, got a number",
        ),
        (
            b'{"request_id": "a", "text": "\\ud800"}',
            ValidationError,
            "field 'text': not valid Unicode",
        ),
        (
            b'{"request_id": "a", "text": "x", "deadline_ms": NaN}',
            DecodeError,
            "NaN is not a number JSON allows",
        ),
        (b'{"request_id": "a", "request_id": "b", "text": "x"}', DecodeError, "duplicate key"),
        (_json(request_id="a", text="   "), ValidationError, "text is empty"),
        (b"[" * 100_000, DecodeError, "unknown writer|not Avro"),
        (b"{" * 60_000, DecodeError, "not a JSON object"),
    ],
)
def test_a_json_request_that_breaks_the_schema_names_the_field(
    value: bytes, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message) as caught:
        _parse(value, ValidationSettings(max_payload_bytes=200_000))
    if error is ValidationError and b'"request_id": "a"' in value:
        assert caught.value.request_id == "a"  # type: ignore[attr-defined]


def test_an_oversize_payload_still_names_its_request() -> None:
    small = ValidationSettings(max_payload_bytes=100, max_text_chars=10_000)
    _, avro = request_bytes("x" * 500, request_id="big-avro")
    big_json = _json(request_id="big-json", text="x" * 500)
    for value, rid in ((avro, "big-avro"), (big_json, "big-json")):
        with pytest.raises(ValidationError, match="exceeds the cap of 100") as caught:
            _parse(value, small)
        assert caught.value.request_id == rid
    assert peek_request_id(b"\xc3\x01" + b"\x00" * 8 + b"\xff") is None
    assert peek_request_id(b'{"text": "no id here"}') is None


def test_an_oversize_framed_payload_names_its_request_when_its_writer_schema_is_known() -> None:
    """In the Schema Registry's framing the id is read only after the writer's schema
    (already known) says the first field is the string ``request_id``."""
    small = ValidationSettings(max_payload_bytes=100, max_text_chars=10_000)
    _, avro = request_bytes("x" * 500, request_id="big-framed")
    framed = MAGIC + (7).to_bytes(4, "big") + avro[HEADER_LEN:]
    ours = request_codec().current.parsed
    reordered = {**ours, "fields": ours["fields"][1:] + ours["fields"][:1]}

    def known(schema_id: int) -> Any:
        if schema_id != 7:
            raise UnknownSchemaId(f"no schema {schema_id}")
        return ours

    def unavailable(schema_id: int) -> Any:
        raise RegistryUnavailable(f"schema {schema_id} was not looked up yet")

    with pytest.raises(ValidationError, match="exceeds the cap of 100") as caught:
        parse(framed, lane="standard", lane_deadline_ms=1_000, model_id="m", limits=small,
              received_at_ms=5_000, writer_of=known)  # fmt: skip
    assert caught.value.request_id == "big-framed"
    assert peek_request_id(framed, known) == "big-framed"
    assert peek_request_id(framed, lambda _id: reordered) is None  # first field: the text
    assert peek_request_id(framed, unavailable) is None
    assert peek_request_id(MAGIC + (8).to_bytes(4, "big") + avro[HEADER_LEN:], known) is None
    assert peek_request_id(framed) is None  # no registry here
    assert peek_request_id(MAGIC + b"\x00\x00") is None


@given(st.binary(max_size=300))
def test_json_looking_bytes_never_raise_anything_else(tail: bytes) -> None:
    for value in (b"{" + tail, b'{"request_id": "a", "text": ' + tail):
        with contextlib.suppress(PermanentError):
            _parse(value)
