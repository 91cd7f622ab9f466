"""Intake: every input becomes a Request or a Decode/ValidationError, nothing else."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.codecs.avro import MARKER, request_codec
from pipeline.errors import DecodeError, PermanentError, ValidationError
from pipeline.kafka.client import request_bytes
from pipeline.settings import ValidationSettings
from pipeline.worker.intake import parse
from pipeline.worker.records import Request

LIMITS = ValidationSettings(max_payload_bytes=4096, max_text_chars=1000)


def _parse(value: bytes | None, lane: str = "standard") -> Request:
    return parse(
        value,
        lane=lane,
        lane_deadline_ms=2000,
        model_id="m@1",
        limits=LIMITS,
        received_at_ms=50_000,
    )


def test_valid_request_gets_lane_deadline_and_hash() -> None:
    _, value = request_bytes("hello", request_id="r1", created_at_ms=10_000)
    req = _parse(value)
    assert req.request_id == "r1" and req.lane == "standard"
    assert req.deadline_ms == 12_000


def test_own_deadline_shortens_but_never_lengthens() -> None:
    _, short = request_bytes("hi", created_at_ms=10_000, deadline_ms=10_500)
    _, long = request_bytes("hi", created_at_ms=10_000, deadline_ms=99_000)
    assert _parse(short).deadline_ms == 10_500
    assert _parse(long).deadline_ms == 12_000


@pytest.mark.parametrize(
    ("text", "error", "fragment"),
    [
        ("", ValidationError, "empty"),
        (" \n\t", ValidationError, "empty"),
        ("x" * 1001, ValidationError, "exceeds"),
    ],
)
def test_bad_text_is_a_validation_error_with_request_id(
    text: str, error: type[Exception], fragment: str
) -> None:
    _, value = request_bytes(text, request_id="bad-1")
    with pytest.raises(error, match=fragment) as info:
        _parse(value)
    assert getattr(info.value, "request_id", None) == "bad-1"


def test_oversized_payload_rejected_before_decoding() -> None:
    with pytest.raises(ValidationError, match="payload"):
        _parse(MARKER + b"\x00" * 5000)


def test_nul_bytes_are_text_like_any_other() -> None:
    _, value = request_bytes("a\x00b", request_id="nul")
    assert _parse(value).text == "a\x00b"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=5000), st.booleans())
def test_any_bytes_give_request_or_permanent_error(data: bytes, with_header: bool) -> None:
    if with_header:
        data = MARKER + request_codec().current.fingerprint + data
    try:
        _parse(data)
    except (DecodeError, ValidationError):
        pass
    except PermanentError as exc:  # pragma: no cover - would be a new, undocumented type
        pytest.fail(f"unexpected {exc!r}")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=1200), st.text(min_size=1, max_size=40))
def test_any_text_round_trips_or_is_rejected_for_a_stated_reason(text: str, rid: str) -> None:
    try:
        _, value = request_bytes(text, request_id=rid)
    except (UnicodeEncodeError, ValueError):
        return  # lone surrogates cannot be encoded by any producer
    try:
        req = _parse(value)
    except ValidationError as exc:
        assert not text.strip() or len(text) > 1000 or len(value) > 4096, exc
        return
    assert req.text == text
