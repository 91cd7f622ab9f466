"""The compiled reader (pipeline.codecs.reader): fastavro's records, float arrays as bytes."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.codecs.avro import MARKER, SCHEMA_DIR, Codec, request_codec, result_codec
from pipeline.codecs.writer import long_bytes
from pipeline.errors import DecodeError

_text = st.text(max_size=30)
_long = st.integers(-(2**63), 2**63 - 1)


def _packed(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` as ``floats_as_bytes`` gives it: the embedding as float32 bytes."""
    emb = record.get("embedding")
    if emb is None:
        return record
    return {**record, "embedding": struct.pack(f"<{len(emb)}f", *emb)}


_results = st.fixed_dictionaries(
    {
        "request_id": _text, "content_hash": _text, "model_name": _text,
        "model_version": _text, "task": _text, "priority": _text,
        "embedding": st.none() | st.lists(st.floats(width=32), max_size=500),
        "label": st.none() | _text, "score": st.none() | st.floats(width=32),
        "served": st.sampled_from(["computed", "stored", "inflight", "batch"]),
        "created_at_ms": _long, "completed_at_ms": _long,
        "queue_ms": st.floats(), "inference_ms": st.floats(),
        "batch_size": st.integers(-(2**31), 2**31 - 1),
        "metadata": st.dictionaries(_text, _text, max_size=4),
    }
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(_results)
def test_a_result_reads_as_fastavro_reads_it_with_the_embedding_as_its_bytes(
    record: dict[str, Any],
) -> None:
    codec = result_codec()
    assert codec._reader is not None  # the compiled reader is the one under test
    data = codec.encode(record)
    fast = codec.decode(data)
    mine = codec.decode(data, floats_as_bytes=True)
    # NaN != NaN: compare the records' encodings, and the embedding's bits.
    assert mine.keys() == fast.keys()
    assert codec.encode(mine) == codec.encode(fast) == data
    assert mine["embedding"] == _packed(fast)["embedding"]
    assert {k: v for k, v in mine.items() if not isinstance(v, float)} == {
        k: v for k, v in _packed(fast).items() if not isinstance(v, float)
    }


_requests = st.fixed_dictionaries(
    {
        "request_id": _text, "text": st.text(max_size=200), "created_at_ms": _long,
        "deadline_ms": st.none() | _long, "source": _text,
        "metadata": st.dictionaries(_text, _text, max_size=4),
    }
)  # fmt: skip


def _fastavro(codec: Codec, data: bytes) -> Any:
    """What fastavro reads of a single-object body of ``codec``'s current schema."""
    body = io.BytesIO(data[len(MARKER) + 8 :])
    record = fastavro.schemaless_reader(body, codec.current.parsed, None)
    if body.tell() != len(data) - len(MARKER) - 8:
        raise ValueError("bytes left over")
    return record


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=120), _requests)
def test_a_request_decodes_as_fastavro_reads_it_or_fails_with_a_decode_error(
    tail: bytes, record: dict[str, Any]
) -> None:
    """A request (no float arrays) decodes through the compiled reader: what fastavro
    reads of a request's encoding, and of the same cut short or spliced with noise;
    what fastavro refuses, a DecodeError."""
    codec = request_codec()
    assert codec._reader is not None and not codec._float_arrays  # the path under test
    data = codec.encode(record)
    assert codec.decode(data) == _fastavro(codec, data) == record
    body = data[len(MARKER) + 8 :]
    header = MARKER + codec.current.fingerprint
    for candidate in (header + tail, header + body[: len(tail)] + tail, header + body + tail):
        try:
            fast = _fastavro(codec, candidate)
        except Exception:
            with pytest.raises(DecodeError):
                codec.decode(candidate)
            continue
        assert codec.decode(candidate) == fast


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200), _results)
def test_any_bytes_read_as_fastavro_reads_them_or_fail_with_a_decode_error(
    tail: bytes, record: dict[str, Any]
) -> None:
    """Hostile bytes: a record's encoding cut short or spliced with noise reads as
    fastavro reads it, or fails with DecodeError (never another exception)."""
    codec = result_codec()
    body = codec.encode(record)[10:]
    header = MARKER + codec.current.fingerprint
    for candidate in (header + tail, header + body[: len(tail)] + tail, header + body + tail):
        try:
            mine = codec.decode(candidate, floats_as_bytes=True)
        except DecodeError:
            continue
        fast = codec.decode(candidate)  # what the reader accepts, fastavro reads the same
        assert codec.encode(mine) == codec.encode(fast)


def test_blocks_written_by_another_writer_read_as_fastavro_reads_them() -> None:
    """Avro lets a writer split an array or map into blocks, with a negative count and
    the block's byte size (Java's writers do): every block is read, in order."""
    codec = result_codec()
    plain = codec.encode(
        {
            "request_id": "r", "content_hash": "h", "model_name": "m", "model_version": "1",
            "priority": "bulk", "embedding": [1.0, 2.0, 3.0], "served": "stored",
            "created_at_ms": 1, "completed_at_ms": 2, "metadata": {"a": "1", "b": "2"},
        }
    )  # fmt: skip
    floats = struct.pack("<3f", 1.0, 2.0, 3.0)
    one_block = long_bytes(3) + floats + b"\x00"
    two_blocks = long_bytes(-2) + long_bytes(8) + floats[:8] + long_bytes(1) + floats[8:] + b"\x00"
    entry_a, entry_b = b"\x02a\x021", b"\x02b\x022"
    one_map = long_bytes(2) + entry_a + entry_b + b"\x00"
    two_maps = long_bytes(1) + entry_a + long_bytes(-1) + long_bytes(4) + entry_b + b"\x00"
    assert one_block in plain and plain.endswith(one_map)
    data = plain.replace(one_block, two_blocks)[: -len(one_map)] + two_maps
    mine = codec.decode(data, floats_as_bytes=True)
    assert mine == _packed(codec.decode(data))
    assert mine["embedding"] == floats and mine["metadata"] == {"a": "1", "b": "2"}


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1 << 20, max_value=1 << 62))
def test_huge_declared_lengths_fail_fast(length: int) -> None:
    codec = result_codec()
    with pytest.raises(DecodeError):
        codec.decode(MARKER + codec.current.fingerprint + long_bytes(length), floats_as_bytes=True)
    # An embedding that declares more floats than the bytes left.
    data = codec.encode({
        "request_id": "r", "content_hash": "h", "model_name": "m", "model_version": "1",
        "priority": "bulk", "embedding": [1.0], "served": "stored",
        "created_at_ms": 1, "completed_at_ms": 2,
    })  # fmt: skip
    cut = data.replace(long_bytes(1) + struct.pack("<f", 1.0), long_bytes(length), 1)
    with pytest.raises(DecodeError):
        codec.decode(cut, floats_as_bytes=True)


def test_an_older_writer_schema_is_read_by_fastavro_and_its_floats_packed(
    tmp_path: Path,
) -> None:
    """A record of another version than the current one is resolved by fastavro as
    always; ``floats_as_bytes`` still gives its embedding as bytes."""
    current = json.loads((SCHEMA_DIR / "InferenceResult.avsc").read_text(encoding="utf-8"))
    older = {**current, "fields": [f for f in current["fields"] if f["name"] != "batch_size"]}
    (tmp_path / "history").mkdir()
    (tmp_path / "InferenceResult.avsc").write_text(json.dumps(current), encoding="utf-8")
    (tmp_path / "history" / "InferenceResult.v0.avsc").write_text(
        json.dumps(older), encoding="utf-8"
    )
    codec = Codec.load("InferenceResult", tmp_path)
    old = next(v for v in codec.by_fingerprint.values() if v is not codec.current)
    record: dict[str, Any] = {
        "request_id": "r", "content_hash": "h", "model_name": "m", "model_version": "1",
        "task": "embed", "priority": "bulk", "embedding": [0.5, -1.0], "label": None,
        "score": None, "served": "stored", "created_at_ms": 1, "completed_at_ms": 2,
        "queue_ms": 0.0, "inference_ms": 0.0, "metadata": {},
    }  # fmt: skip
    buf = io.BytesIO()
    buf.write(MARKER + old.fingerprint)
    fastavro.schemaless_writer(buf, old.parsed, record)
    mine = codec.decode(buf.getvalue(), floats_as_bytes=True)
    assert mine == {**record, "batch_size": 0, "embedding": struct.pack("<2f", 0.5, -1.0)}


def test_invalid_utf8_and_out_of_range_indexes_fail_with_a_decode_error() -> None:
    codec = result_codec()
    data = codec.encode({
        "request_id": "rr", "content_hash": "h", "model_name": "m", "model_version": "1",
        "priority": "bulk", "served": "batch", "created_at_ms": 1, "completed_at_ms": 2,
    })  # fmt: skip
    assert codec.decode(data, floats_as_bytes=True)["served"] == "batch"
    header = len(MARKER) + 8
    bad_text = data[:header] + b"\x04\xff\xfe" + data[header + 3 :]  # "rr" -> 2 bad bytes
    served = data.rindex(long_bytes(3))  # the enum's index (batch = 3), before 3 longs
    bad_enum = data[:served] + long_bytes(4) + data[served + 1 :]
    bad_union = data.replace(b"\x00\x00\x00", b"\x06\x00\x00", 1)  # embedding: branch 3
    for bad in (bad_text, bad_enum, bad_union):
        with pytest.raises(DecodeError):
            codec.decode(bad)
        with pytest.raises(DecodeError):
            codec.decode(bad, floats_as_bytes=True)
    # fastavro reads a negative enum index from the end (-1: "batch"); the reader refuses it.
    negative = data[:served] + long_bytes(-1) + data[served + 1 :]
    with pytest.raises(DecodeError, match="enum index -1"):
        codec.decode(negative, floats_as_bytes=True)
