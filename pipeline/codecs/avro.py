"""Avro single-object encoding (the Avro spec's), with a registry by fingerprint.

A record on the wire is ``C3 01`` + the 8-byte little-endian CRC-64-AVRO
fingerprint of the writer schema's parsing canonical form + the Avro binary
body. Readers look the writer schema up by fingerprint among every known
version (``schemas/*.avsc`` and ``schemas/history/*.avsc``) and resolve it to
the current schema, so records written with an older version still decode.

A request may also arrive as a UTF-8 JSON object with the schema's field
names (:meth:`Codec.decode_json`), or in the Confluent Schema Registry's
framing (:meth:`Codec.decode_registry`: ``00``, a 4-byte schema id, the Avro
body; the writer schema comes from the registry, :mod:`pipeline.codecs.registry`);
:meth:`Codec.decode_any` tells the encodings apart by their first bytes
(``C3 01`` Avro single-object, ``{`` JSON, ``00`` registry).

Promises: ``decode`` and ``decode_any`` either return a dict valid for the
current schema or raise :class:`~pipeline.errors.DecodeError` (bytes that are
no record) or :class:`~pipeline.errors.ValidationError` (a JSON object that
breaks the schema: the message names the field); they never read past the
buffer and never allocate more than a small multiple of the input's size.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import fastavro
import fastavro.schema
from fastavro._read_common import SchemaResolutionError

from pipeline.codecs.json_records import json_record
from pipeline.codecs.reader import compile_reader
from pipeline.codecs.registry import FRAME_LEN, split_frame
from pipeline.codecs.writer import compile_writer
from pipeline.errors import DecodeError, SchemaMismatch

__all__ = [
    "MARKER",
    "Codec",
    "SchemaVersion",
    "crc64_avro",
    "dead_letter_codec",
    "request_codec",
    "result_codec",
]

MARKER = b"\xc3\x01"
HEADER_LEN = len(MARKER) + 8
SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"

_EMPTY = 0xC15D213AA4D7A795


@cache
def _crc64_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY & -(fp & 1))
        table.append(fp)
    return tuple(table)


def crc64_avro(data: bytes) -> int:
    """The Avro spec's 64-bit Rabin fingerprint (CRC-64-AVRO) of ``data``."""
    table = _crc64_table()
    fp = _EMPTY
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


@dataclass(frozen=True)
class SchemaVersion:
    """One known writer schema: its parsed form and fingerprint bytes."""

    name: str
    path: Path
    parsed: Any
    fingerprint: bytes


def _load_schema(path: Path) -> SchemaVersion:
    raw = json.loads(path.read_text(encoding="utf-8"))
    parsed = fastavro.parse_schema(raw)
    canonical = fastavro.schema.to_parsing_canonical_form(parsed)
    fp = crc64_avro(canonical.encode("utf-8")).to_bytes(8, "little")
    return SchemaVersion(name=raw["name"], path=path, parsed=parsed, fingerprint=fp)


class Codec:
    """Encode with the current schema of one record type; decode any known version."""

    def __init__(self, current: SchemaVersion, history: list[SchemaVersion]) -> None:
        self.current = current
        self.by_fingerprint: dict[bytes, SchemaVersion] = {current.fingerprint: current}
        for old in history:
            self.by_fingerprint.setdefault(old.fingerprint, old)
        # The current schema's own writer (pipeline.codecs.writer): the same bytes as
        # fastavro in about a third of the time; None (fastavro) for shapes it lacks.
        self._writer = compile_writer(current.parsed)
        self._header = MARKER + current.fingerprint
        # Its own reader (pipeline.codecs.reader), for records of the current schema:
        # those without float arrays, and those whose float arrays are wanted as bytes
        # (:meth:`decode`'s ``floats_as_bytes``).
        self._reader = compile_reader(current.parsed)
        self._float_arrays = [
            f["name"] for f in current.parsed["fields"] if _is_float_array(f["type"])
        ]

    @classmethod
    def load(cls, name: str, schema_dir: Path = SCHEMA_DIR) -> Codec:
        """The codec of record ``name`` (e.g. ``InferenceRequest``)."""
        current = _load_schema(schema_dir / f"{name}.avsc")
        history = [_load_schema(p) for p in sorted((schema_dir / "history").glob(f"{name}.*.avsc"))]
        return cls(current, history)

    def encode(
        self,
        record: Mapping[str, Any],
        schema: SchemaVersion | None = None,
        *,
        header: bytes | None = None,
    ) -> bytes:
        """Single-object encode ``record`` with ``schema`` (default: the current one).
        ``header`` replaces the single-object header (the Confluent framing's, say:
        :func:`pipeline.codecs.registry.frame_header` of the current schema's id)."""
        schema = schema or self.current
        if self._writer is not None and schema is self.current:
            out = bytearray(self._header if header is None else header)
            self._writer(out, record)
            return bytes(out)
        buf = io.BytesIO()
        buf.write(MARKER + schema.fingerprint if header is None else header)
        fastavro.schemaless_writer(buf, schema.parsed, _floats_as_lists(record))
        return buf.getvalue()

    def decode(
        self, data: bytes | bytearray | memoryview | None, *, floats_as_bytes: bool = False
    ) -> dict[str, Any]:
        """Decode a single-object-encoded record into the current schema's shape.
        ``floats_as_bytes``: each array of floats (a result's embedding) comes as its
        float32 little-endian bytes, not a list (:meth:`encode` takes either): a
        stored result is served without its embedding becoming Python floats.

        Raises DecodeError for anything else: no value, wrong marker, unknown
        fingerprint, a truncated or corrupt body, bytes left over.
        """
        if data is None:
            raise DecodeError("record has no value (tombstone)")
        data = bytes(data)
        if len(data) < HEADER_LEN or not data.startswith(MARKER):
            raise DecodeError(
                "not Avro single-object encoding: expected marker C3 01, "
                f"got {data[:2].hex() or 'nothing'}"
            )
        fp = data[2:HEADER_LEN]
        writer = self.by_fingerprint.get(fp)
        if writer is None:
            raise DecodeError(
                f"unknown writer schema fingerprint {fp.hex()} for {self.current.name}; "
                "is the producer on a newer schema than this worker?"
            )
        # The compiled reader reads the current schema's records as fastavro does, at
        # 0.7x its time for a request (which has no float arrays to keep as bytes).
        compiled = floats_as_bytes or not self._float_arrays
        if compiled and self._reader is not None and writer is self.current:
            return self._read_compiled(data)
        body = io.BytesIO(data[HEADER_LEN:])
        try:
            record = fastavro.schemaless_reader(body, writer.parsed, self.current.parsed)
        except Exception as exc:  # fastavro raises many types on corrupt input
            raise DecodeError(
                f"corrupt {self.current.name} body: {type(exc).__name__}: {exc}"
            ) from exc
        if body.tell() != len(data) - HEADER_LEN:
            raise DecodeError(
                f"{len(data) - HEADER_LEN - body.tell()} trailing bytes after {self.current.name}"
            )
        if not isinstance(record, dict):
            raise DecodeError(f"{self.current.name} did not decode to a record")
        if floats_as_bytes:  # another version's record, resolved by fastavro: packed
            for name in self._float_arrays:
                values = record.get(name)
                if values is not None:
                    record[name] = struct.pack(f"<{len(values)}f", *values)
        return record

    def _read_compiled(self, data: bytes) -> dict[str, Any]:
        """A record of the current schema read by its compiled reader (float arrays as
        their bytes); ``data`` has passed :meth:`decode`'s header checks."""
        assert self._reader is not None
        try:
            record, end = self._reader(data, HEADER_LEN)
        except Exception as exc:  # the reader raises several types on corrupt input
            raise DecodeError(
                f"corrupt {self.current.name} body: {type(exc).__name__}: {exc}"
            ) from exc
        if end != len(data):
            raise DecodeError(f"{len(data) - end} trailing bytes after {self.current.name}")
        return record

    def decode_json(self, data: bytes | bytearray | memoryview) -> dict[str, Any]:
        """Decode a UTF-8 JSON object with the current schema's fields, as strictly as
        Avro: every field without a default present, no unknown field, each value of
        its field's type (``long`` a 64-bit integer, strings valid Unicode).

        Raises DecodeError for bytes that are not one JSON object, ValidationError
        naming the field otherwise (with the request id when it could be read).
        """
        return json_record(bytes(data), self.current.parsed)

    def decode_registry(self, data: bytes, writer_of: Callable[[int], Any]) -> dict[str, Any]:
        """Decode a Confluent-framed record into the current schema's shape.

        ``writer_of(schema_id)`` gives the writer's parsed schema (or raises
        DecodeError, e.g. :class:`~pipeline.errors.UnknownSchemaId`). Raises
        SchemaMismatch when the writer's schema cannot be read as the current one,
        DecodeError for a body that does not decode or leaves bytes over.
        """
        schema_id = split_frame(data)
        writer = writer_of(schema_id)
        body = io.BytesIO(data)
        body.seek(FRAME_LEN)
        try:
            record = fastavro.schemaless_reader(body, writer, self.current.parsed)
        except SchemaResolutionError as exc:
            raise SchemaMismatch(
                f"writer schema {schema_id} cannot be read as this worker's "
                f"{self.current.name}: {exc}"
            ) from exc
        except Exception as exc:  # fastavro raises many types on corrupt input
            raise DecodeError(
                f"corrupt {self.current.name} body (writer schema {schema_id}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if body.tell() != len(data):
            raise DecodeError(
                f"{len(data) - body.tell()} trailing bytes after {self.current.name} "
                f"(writer schema {schema_id})"
            )
        if not isinstance(record, dict):
            raise DecodeError(f"{self.current.name} did not decode to a record")
        return record

    def decode_any(
        self,
        data: bytes | bytearray | memoryview | None,
        writer_of: Callable[[int], Any] | None = None,
    ) -> dict[str, Any]:
        """Decode Avro single-object, JSON or (given ``writer_of``, see
        :meth:`decode_registry`) Confluent-framed Avro, told apart by the first bytes."""
        if data is not None:
            head = bytes(data[:1])
            if head == b"{":
                return self.decode_json(data)
            if head == b"\x00":
                if writer_of is None:
                    raise DecodeError(
                        "Confluent Schema Registry framing (magic byte 00), and no registry "
                        "is configured here (PIPELINE_REGISTRY_URL)"
                    )
                return self.decode_registry(bytes(data), writer_of)
        return self.decode(data)


@cache
def request_codec() -> Codec:
    """The shared codec of ``InferenceRequest``."""
    return Codec.load("InferenceRequest")


@cache
def result_codec() -> Codec:
    """The shared codec of ``InferenceResult``."""
    return Codec.load("InferenceResult")


@cache
def dead_letter_codec() -> Codec:
    """The shared codec of ``DeadLetter``."""
    return Codec.load("DeadLetter")


def _is_float_array(kind: Any) -> bool:
    """Whether a field of type ``kind`` is an array of floats (or null or one)."""
    if isinstance(kind, list):
        return any(_is_float_array(k) for k in kind)
    return isinstance(kind, dict) and kind.get("type") == "array" and kind.get("items") == "float"


def _floats_as_lists(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` for fastavro: float32 bytes (an embedding) become a list of floats."""
    out = dict(record)
    for key, value in out.items():
        if isinstance(value, bytes) and key == "embedding":
            out[key] = list(struct.unpack(f"<{len(value) // 4}f", value))
    return out
