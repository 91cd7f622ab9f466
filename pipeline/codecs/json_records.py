"""JSON records checked against an Avro schema, as strictly as Avro decoding is.

:func:`json_record` turns a UTF-8 JSON object into the dict Avro decoding of
the same record would give: fields without a default must be present, fields
with one may be left out (the default is filled in), unknown fields, duplicate
keys and ``NaN``/``Infinity`` are refused, and each value must be of its
field's Avro type (``int``/``long`` integers in their signed 32/64-bit range,
never booleans; strings valid Unicode; maps of string keys). Bytes that are not
one JSON object raise :class:`~pipeline.errors.DecodeError`; an object that
breaks the schema raises :class:`~pipeline.errors.ValidationError` naming the
field, with the record's ``request_id`` when it is a string.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pipeline.errors import DecodeError, ValidationError

__all__ = ["json_record"]

_RANGES = {"int": 2**31, "long": 2**63}


class _FieldError(Exception):
    """A value that does not fit its type; ``str`` says what was expected."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _check(value: Any, schema: Any) -> Any:
    """``value`` as Avro would hold it for ``schema``; raises _FieldError."""
    if isinstance(schema, list):  # a union: the first branch that fits
        for branch in schema:
            try:
                return _check(value, branch)
            except _FieldError:
                continue
        names = " or ".join(b if isinstance(b, str) else b.get("type", "?") for b in schema)
        raise _FieldError(f"expected {names}, got {_kind(value)}")
    kind = schema if isinstance(schema, str) else schema.get("type")
    if kind in ("enum", "map", "array"):
        return _check_complex(value, kind, schema)
    if kind == "null":
        if value is not None:
            raise _FieldError(f"expected null, got {_kind(value)}")
        return None
    if kind == "string":
        if not isinstance(value, str):
            raise _FieldError(f"expected a string, got {_kind(value)}")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _FieldError("not valid Unicode (a lone surrogate)") from None
        return value
    if kind == "boolean":
        if not isinstance(value, bool):
            raise _FieldError(f"expected true or false, got {_kind(value)}")
        return value
    if kind in _RANGES:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _FieldError(f"expected an integer ({kind}), got {_kind(value)}")
        bound = _RANGES[kind]
        if not -bound <= value < bound:
            raise _FieldError(f"{value} is out of the {kind} range")
        return value
    if kind in ("float", "double"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _FieldError(f"expected a number, got {_kind(value)}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise _FieldError("expected a finite number")
        return number
    raise _FieldError(f"type {kind!r} is not accepted in JSON")


def _check_complex(value: Any, kind: str, schema: dict[str, Any]) -> Any:
    if kind == "enum":
        if value not in schema["symbols"]:
            raise _FieldError(f"expected one of {', '.join(schema['symbols'])}")
        return value
    if kind == "map":
        if not isinstance(value, dict):
            raise _FieldError(f"expected an object, got {_kind(value)}")
        out = {}
        for key, item in value.items():
            try:
                out[_check(key, "string")] = _check(item, schema["values"])
            except _FieldError as exc:
                raise _FieldError(f"key {key!r}: {exc}") from None
        return out
    if kind == "array":
        if not isinstance(value, list):
            raise _FieldError(f"expected an array, got {_kind(value)}")
        items = []
        for i, item in enumerate(value):
            try:
                items.append(_check(item, schema["items"]))
            except _FieldError as exc:
                raise _FieldError(f"item {i}: {exc}") from None
        return items


def json_record(data: bytes, schema: dict[str, Any]) -> dict[str, Any]:
    """Decode one JSON object against the record ``schema`` (see the module's promise)."""
    try:
        obj = json.loads(
            data.decode("utf-8"),
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
        )
    except UnicodeDecodeError as exc:
        raise DecodeError(
            f"JSON request is not valid UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise DecodeError(f"not a JSON object: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, dict):
        raise DecodeError(f"expected a JSON object, got {_kind(obj)}")
    rid = obj.get("request_id")
    request_id = rid if isinstance(rid, str) and len(rid) <= 256 else None
    fields = schema["fields"]
    known = {f["name"] for f in fields}
    unknown = sorted(k for k in obj if k not in known)
    if unknown:
        raise ValidationError(
            f"unknown field {unknown[0]!r} in JSON {schema.get('name', 'record')}; "
            f"fields are {', '.join(sorted(known))}",
            request_id=request_id,
        )
    record: dict[str, Any] = {}
    for field in fields:
        name = field["name"]
        if name not in obj:
            if "default" not in field:
                raise ValidationError(f"field {name!r} is missing", request_id=request_id)
            default = field["default"]
            record[name] = dict(default) if isinstance(default, dict) else default
            continue
        try:
            record[name] = _check(obj[name], field["type"])
        except _FieldError as exc:
            raise ValidationError(f"field {name!r}: {exc}", request_id=request_id) from None
    return record
