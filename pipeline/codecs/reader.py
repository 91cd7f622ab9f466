"""Avro binary bodies read by code made for one schema, arrays of floats kept as bytes.

Serving a stored result decodes it, swaps a few fields and encodes it again.
fastavro turns the 384 floats of an embedding into 384 Python floats on the
way in, which the writer (:mod:`pipeline.codecs.writer`) packs straight back
into the same 4-byte values: with a real model's embedding that decode was
a tenth of the event loop's time on a simulated GPU host (issue 32). A reader
compiled for the record's own schema keeps each ``array<float>`` as its
float32 little-endian bytes (which the writer copies as they are) and reads
the other fields as fastavro would.

Promise: for the body of a record written with the schema, the function
returns what ``fastavro.schemaless_reader`` returns, except that an array of
floats is its float32 little-endian bytes, and the offset after the body.
For any other bytes it returns such a record or raises (a truncated body, a
length or index out of range, invalid UTF-8; which exception is not
promised); it never reads past ``data`` and allocates no more than a small
multiple of its length (every declared length is checked against what is
left first). Schemas with a
shape not listed in :func:`compile_reader` get ``None``: the caller keeps
fastavro.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Reader", "compile_reader", "read_long"]

#: Reads one record's body from ``data`` at ``pos``: the record, and where it ended.
Reader = Callable[[bytes, int], tuple[dict[str, Any], int]]

_FLOAT = struct.Struct("<f").unpack_from
_DOUBLE = struct.Struct("<d").unpack_from


def read_long(data: bytes, pos: int) -> tuple[int, int]:
    """Avro's zig-zag varint at ``pos``: the long, and the offset after it. Raises
    IndexError when ``data`` ends first, ValueError past 10 bytes."""
    b = data[pos]
    pos += 1
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos
    z, shift = b & 0x7F, 7
    while True:
        b = data[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            return (z >> 1) ^ -(z & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _bytes(data: bytes, pos: int) -> tuple[bytes, int]:
    n, pos = read_long(data, pos)
    end = pos + n
    if n < 0 or end > len(data):
        raise ValueError(f"length {n} at offset {pos} runs past the end ({len(data)} bytes)")
    return data[pos:end], end


def _string(data: bytes, pos: int) -> tuple[str, int]:
    raw, pos = _bytes(data, pos)
    return raw.decode(), pos


def _block(data: bytes, pos: int) -> tuple[int, int]:
    """A block's item count (its byte size, when given, skipped); 0 ends the array."""
    count, pos = read_long(data, pos)
    if count < 0:
        count = -count
        _size, pos = read_long(data, pos)
    return count, pos


def _floats(data: bytes, pos: int) -> tuple[bytes, int]:
    """An array of floats: its items' float32 bytes, every block's, in order."""
    parts: list[bytes] = []
    while True:
        count, pos = _block(data, pos)
        if not count:
            return b"".join(parts), pos
        end = pos + 4 * count
        if end > len(data):
            raise ValueError(f"{count} floats at offset {pos} run past the end")
        parts.append(data[pos:end])
        pos = end


def _string_map(data: bytes, pos: int) -> tuple[dict[str, str], int]:
    out: dict[str, str] = {}
    while True:
        count, pos = _block(data, pos)
        if not count:
            return out, pos
        for _ in range(count):  # each entry reads at least two bytes: bounded by data
            key, pos = _string(data, pos)
            out[key], pos = _string(data, pos)


def _expression(kind: Any, consts: dict[str, Any]) -> list[str] | None:
    """Lines that set ``v`` to a value of type ``kind`` read at ``pos`` (and move
    ``pos`` past it); None if the type is not supported."""
    if kind == "string":
        return ["v, pos = _string(data, pos)"]
    if kind == "bytes":
        return ["v, pos = _bytes(data, pos)"]
    if kind in ("int", "long"):
        return ["v, pos = _long(data, pos)"]
    if kind == "float":
        return ["v = _float(data, pos)[0]", "pos += 4"]
    if kind == "double":
        return ["v = _double(data, pos)[0]", "pos += 8"]
    if isinstance(kind, dict):
        if kind.get("type") == "enum":
            name = f"_symbols{len(consts)}"
            consts[name] = tuple(kind["symbols"])
            return [
                "i, pos = _long(data, pos)",
                f"if not 0 <= i < {len(kind['symbols'])}:",
                f"    raise ValueError(f'enum index {{i}} of {kind.get('name')}')",
                f"v = {name}[i]",
            ]
        if kind.get("type") == "array" and kind.get("items") == "float":
            return ["v, pos = _floats(data, pos)"]
        if kind.get("type") == "map" and kind.get("values") == "string":
            return ["v, pos = _string_map(data, pos)"]
        return None
    if isinstance(kind, list) and len(kind) == 2 and kind[0] == "null":
        inner = _expression(kind[1], consts)
        if inner is None:
            return None
        return [
            "i, pos = _long(data, pos)",
            "if i == 0:",
            "    v = None",
            "elif i == 1:",
            *("    " + line for line in inner),
            "else:",
            "    raise ValueError(f'union index {i}')",
        ]
    return None


def compile_reader(schema: Mapping[str, Any]) -> Reader | None:
    """The reader of the record schema ``schema`` (fastavro's parsed form), or None when
    it has a field whose type is not one of: string, bytes, int, long, float, double,
    an enum, an array of floats, a map of strings, or a union of null with one of
    those."""
    if schema.get("type") != "record":
        return None
    consts: dict[str, Any] = {}
    body: list[str] = []
    for field in schema["fields"]:
        lines = _expression(field["type"], consts)
        if lines is None:
            return None
        body += lines
        body.append(f"out[{field['name']!r}] = v")
    source = "def read(data, pos):\n    out = {}\n" + "".join(f"    {line}\n" for line in body)
    source += "    return out, pos\n"
    namespace: dict[str, Any] = {
        "_long": read_long,
        "_bytes": _bytes,
        "_string": _string,
        "_float": _FLOAT,
        "_double": _DOUBLE,
        "_floats": _floats,
        "_string_map": _string_map,
        **consts,
    }
    exec(compile(source, f"<avro reader of {schema.get('name')}>", "exec"), namespace)
    reader: Reader = namespace["read"]
    return reader
