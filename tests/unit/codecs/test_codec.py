"""Avro single-object encoding: spec conformance, schema evolution, hostile bytes."""

from __future__ import annotations

import io
import json
import struct
from typing import Any

import fastavro
import fastavro.schema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.dead_letters import dead_letter_dict

from pipeline.codecs.avro import (
    MARKER,
    SCHEMA_DIR,
    Codec,
    crc64_avro,
    dead_letter_codec,
    request_codec,
    result_codec,
)
from pipeline.errors import STAGES, DecodeError
from pipeline.observability.metric_families import SERVED

REQUEST = {
    "request_id": "r-1",
    "text": "hello world",
    "created_at_ms": 1_700_000_000_000,
    "deadline_ms": None,
    "source": "test",
    "metadata": {"k": "v"},
}


def test_crc64_matches_fastavro_and_spec_vector() -> None:
    # The Avro spec's empty fingerprint is the CRC's initial value.
    assert crc64_avro(b"") == 0xC15D213AA4D7A795
    # Avro's share/test/data/schema-tests.txt gives these as signed 64-bit values.
    assert crc64_avro(b'"int"') == 8247732601305521295
    assert crc64_avro(b'"string"') == -8142146995180207161 % 2**64
    canonical = fastavro.schema.to_parsing_canonical_form(
        fastavro.parse_schema(json.loads((SCHEMA_DIR / "InferenceRequest.avsc").read_text()))
    )
    # fastavro's hex is the fingerprint's little-endian bytes, the order the
    # single-object encoding puts on the wire.
    expected = fastavro.schema.fingerprint(canonical, "CRC-64-AVRO")
    assert crc64_avro(canonical.encode()).to_bytes(8, "little").hex() == expected


def test_the_dead_letter_stages_and_served_values_are_the_schemas() -> None:
    def symbols(record: str, field: str) -> tuple[str, ...]:
        schema = json.loads((SCHEMA_DIR / f"{record}.avsc").read_text())
        [enum] = [f["type"] for f in schema["fields"] if f["name"] == field]
        return tuple(enum["symbols"])

    assert symbols("DeadLetter", "stage") == STAGES
    assert symbols("InferenceResult", "served") == SERVED


def test_wire_layout_is_single_object_encoding() -> None:
    codec = request_codec()
    data = codec.encode(REQUEST)
    assert data[:2] == MARKER
    assert data[2:10] == codec.current.fingerprint
    assert codec.current.fingerprint == crc64_avro(
        fastavro.schema.to_parsing_canonical_form(codec.current.parsed).encode()
    ).to_bytes(8, "little")


def test_round_trip_each_record_type() -> None:
    assert request_codec().decode(request_codec().encode(REQUEST)) == REQUEST
    result: dict[str, Any] = {
        "request_id": "r",
        "content_hash": "ab",
        "model_name": "m",
        "model_version": "1",
        "task": "embed",
        "priority": "bulk",
        "embedding": [0.5, -0.25],
        "label": None,
        "score": None,
        "served": "computed",
        "created_at_ms": 1,
        "completed_at_ms": 2,
        "queue_ms": 1.5,
        "inference_ms": 2.5,
        "batch_size": 3,
        "metadata": {},
    }
    assert result_codec().decode(result_codec().encode(result)) == result
    letter = dead_letter_dict(DecodeError("bad"), original_offset=7, value=b"\x00\xff")
    assert dead_letter_codec().decode(dead_letter_codec().encode(letter)) == letter
    # A dead letter of an input cut short carries the whole input's length and hash.
    cut = {**letter, "value_length": 1 << 20, "value_sha256": "ab" * 32, "key_length": 4096}
    assert dead_letter_codec().decode(dead_letter_codec().encode(cut)) == cut


def test_older_writer_schema_still_decodes_with_defaults() -> None:
    codec = request_codec()
    (v1,) = [v for v in codec.by_fingerprint.values() if v.path.parent.name == "history"]
    old = {"request_id": "r-old", "text": "t", "created_at_ms": 5, "deadline_ms": 9}
    decoded = codec.decode(codec.encode(old, schema=v1))
    assert decoded == {**old, "source": "", "metadata": {}}


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (None, "no value"),
        (b"", "marker"),
        (b'{"text": 1}', "marker"),
        (MARKER + b"\x00" * 8 + b"\x02a", "unknown writer schema"),
    ],
)
def test_rejects_foreign_bytes(data: bytes | None, fragment: str) -> None:
    with pytest.raises(DecodeError, match=fragment):
        request_codec().decode(data)


def test_rejects_truncated_and_trailing_bytes() -> None:
    data = request_codec().encode(REQUEST)
    with pytest.raises(DecodeError):
        request_codec().decode(data[:-3])
    with pytest.raises(DecodeError, match="trailing"):
        request_codec().decode(data + b"\x00")


def test_rejects_invalid_utf8() -> None:
    codec = request_codec()
    header = MARKER + codec.current.fingerprint
    # request_id "r" then a text of length 2 holding invalid UTF-8.
    body = b"\x02r" + b"\x04\xff\xfe" + b"\x00\x00\x00\x00"
    with pytest.raises(DecodeError):
        codec.decode(header + body)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_any_bytes_decode_or_raise_decode_error(data: bytes) -> None:
    codec = request_codec()
    for candidate in (data, MARKER + codec.current.fingerprint + data):
        try:
            record = codec.decode(candidate)
        except DecodeError:
            continue
        assert set(record) == {f["name"] for f in codec.current.parsed["fields"]}


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1 << 20, max_value=1 << 62))
def test_huge_declared_lengths_fail_fast(length: int) -> None:
    codec = request_codec()
    # zig-zag varint of a huge string length, then nothing behind it
    n = length << 1
    varint = bytearray()
    while n > 0x7F:
        varint.append((n & 0x7F) | 0x80)
        n >>= 7
    varint.append(n)
    with pytest.raises(DecodeError):
        codec.decode(MARKER + codec.current.fingerprint + bytes(varint))


def _fastavro_encoded(codec: Codec, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    buf.write(MARKER + codec.current.fingerprint)
    fastavro.schemaless_writer(buf, codec.current.parsed, dict(record))
    return buf.getvalue()


_text = st.text(max_size=40)
_long = st.integers(-(2**63), 2**63 - 1)
_double = st.floats(allow_nan=False)


def _same_bytes_as_fastavro(codec: Codec, record: dict[str, Any]) -> None:
    assert codec._writer is not None  # the compiled writer is the one under test
    data = codec.encode(record)
    assert data == _fastavro_encoded(codec, record)
    decoded = codec.decode(data)
    assert decoded == {**decoded, **record}  # what was given decodes back; the rest defaults


@settings(max_examples=300, deadline=None)
@given(
    embedding=st.none() | st.lists(st.floats(width=32, allow_nan=False), max_size=1100),
    label=st.none() | _text,
    score=st.none() | st.floats(width=32, allow_nan=False),
    served=st.sampled_from(["computed", "stored", "inflight", "batch"]),
    ids=st.tuples(_text, _text, _text),
    times=st.tuples(_long, st.integers(0, 2**40)),
    durations=st.tuples(_double, _double),
    batch_size=st.integers(-(2**31), 2**31 - 1),
    metadata=st.dictionaries(_text, _text, max_size=3),
    task=st.none() | st.sampled_from(["embed", "classify"]),
)
def test_a_result_encodes_byte_for_byte_as_fastavro_writes_it(
    *,
    embedding: list[float] | None,
    label: str | None,
    score: float | None,
    served: str,
    ids: tuple[str, str, str],
    times: tuple[int, int],
    durations: tuple[float, float],
    batch_size: int,
    metadata: dict[str, str],
    task: str | None,
) -> None:
    """Results are written by code compiled for their schema (pipeline.codecs.writer; fastavro
    is twice as slow, seven times with an embedding): the bytes must be fastavro's own, for
    every shape of result, a field left to its default included, and decode back."""
    record = {
        "request_id": ids[0], "content_hash": ids[1], "model_name": ids[2],
        "model_version": "1", "priority": "bulk", "embedding": embedding,
        "label": label, "score": score, "served": served, "created_at_ms": times[0],
        "completed_at_ms": times[1], "queue_ms": durations[0], "inference_ms": durations[1],
        "batch_size": batch_size, "metadata": metadata,
    }  # fmt: skip
    if task is not None:
        record["task"] = task
    _same_bytes_as_fastavro(result_codec(), record)
    if embedding is not None:  # as a model hands it over: float32 bytes, the same on the wire
        packed = {**record, "embedding": struct.pack(f"<{len(embedding)}f", *embedding)}
        assert result_codec().encode(packed) == result_codec().encode(record)


@settings(max_examples=200, deadline=None)
@given(
    coordinates=st.tuples(st.integers(0, 2**31 - 1), _long, _long, _long),
    key=st.none() | st.binary(max_size=40),
    value=st.none() | st.binary(max_size=300),
    stage=st.sampled_from(STAGES),
    texts=st.tuples(_text, st.text(max_size=400), _text),
    request_id=st.none() | _text,
    lengths=st.tuples(st.none() | _long, st.none() | _long, st.none() | _text),
    attempts=st.none() | st.integers(1, 2**31 - 1),
)
def test_a_dead_letter_encodes_byte_for_byte_as_fastavro_writes_it(
    *,
    coordinates: tuple[int, int, int, int],
    key: bytes | None,
    value: bytes | None,
    stage: str,
    texts: tuple[str, str, str],
    request_id: str | None,
    lengths: tuple[int | None, int | None, str | None],
    attempts: int | None,
) -> None:
    partition, offset, timestamp, failed_at = coordinates
    record: dict[str, Any] = {
        "original_topic": texts[0], "original_partition": partition, "original_offset": offset,
        "original_timestamp_ms": timestamp, "key": key, "value": value, "stage": stage,
        "error_class": texts[2], "error_message": texts[1], "failed_at_ms": failed_at,
        "request_id": request_id, "worker": texts[2], "value_length": lengths[0],
        "key_length": lengths[1], "value_sha256": lengths[2],
    }  # fmt: skip
    if attempts is not None:
        record["attempts"] = attempts
    _same_bytes_as_fastavro(dead_letter_codec(), record)


@settings(max_examples=200, deadline=None)
@given(
    texts=st.tuples(_text, st.text(max_size=400), _text),
    created=st.none() | _long,
    deadline=st.none() | _long,
    metadata=st.none() | st.dictionaries(_text, _text, max_size=4),
)
def test_a_request_encodes_byte_for_byte_as_fastavro_writes_it(
    texts: tuple[str, str, str],
    created: int | None,
    deadline: int | None,
    metadata: dict[str, str] | None,
) -> None:
    record: dict[str, Any] = {"request_id": texts[0], "text": texts[1], "source": texts[2]}
    record["deadline_ms"] = deadline
    if created is not None:
        record["created_at_ms"] = created
    if metadata is not None:
        record["metadata"] = metadata
    _same_bytes_as_fastavro(request_codec(), record)


def test_a_schema_the_writer_cannot_compile_is_written_by_fastavro(tmp_path: Any) -> None:
    """A shape compile_writer lacks (here a nested record) leaves the codec on fastavro."""
    schema = {
        "type": "record", "name": "Outer", "namespace": "t",
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "inner", "type": {"type": "record", "name": "Inner",
                                       "fields": [{"name": "n", "type": "long"}]}},
        ],
    }  # fmt: skip
    (tmp_path / "Outer.avsc").write_text(json.dumps(schema), encoding="utf-8")
    codec = Codec.load("Outer", tmp_path)
    assert codec._writer is None
    record = {"id": "x", "inner": {"n": 5}}
    assert codec.encode(record) == _fastavro_encoded(codec, record)
    assert codec.decode(codec.encode(record)) == record


def test_a_result_with_a_bad_embedding_fails_to_encode_as_any_bad_record_does() -> None:
    codec = result_codec()
    record = codec.decode(codec.encode({
        "request_id": "r", "content_hash": "h", "model_name": "m", "model_version": "1",
        "priority": "bulk", "embedding": [0.5], "served": "computed", "created_at_ms": 1,
        "completed_at_ms": 2,
    }))  # fmt: skip
    assert record["task"] == "embed" and record["embedding"] == [0.5]
    with pytest.raises(Exception):  # noqa: B017 - Publisher.result_begin turns any into a dead letter
        codec.encode({**record, "embedding": ["not a float"]})
    nan = codec.decode(codec.encode({**record, "embedding": [float("nan")]}))
    assert nan["embedding"][0] != nan["embedding"][0]
