"""The Confluent Schema Registry: its wire framing, and a small blocking client.

A Confluent-framed value is magic byte ``00``, the writer schema's id as 4
bytes big-endian, then the Avro binary body (what confluent-kafka's
``AvroSerializer`` writes). :func:`split_frame` and :func:`frame_header` are
the pure halves; :class:`RegistryClient` looks schemas up by id and registers
them under a subject, over HTTP(S) with basic auth and client certificates as
confluent-kafka's ``SchemaRegistryClient`` takes them.

The client blocks (``urllib``): call it from a thread, never the event loop
(the worker's :mod:`pipeline.worker.writer_schemas` does). Errors, by what
happens next: :class:`~pipeline.errors.UnknownSchemaId` (the registry answered:
no such schema, or one this pipeline cannot read; the input is at fault),
:class:`~pipeline.errors.RegistryUnavailable` (it did not answer as a registry:
wait and ask again; the input is not at fault).
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import fastavro

from pipeline.errors import (
    ConfigurationError,
    DecodeError,
    RegistryUnavailable,
    UnknownSchemaId,
)
from pipeline.settings import RegistrySettings, Settings

__all__ = [
    "FRAME_LEN",
    "MAGIC",
    "AnswerHeaders",
    "RegistryClient",
    "SchemaCache",
    "WriterSchema",
    "frame_header",
    "register_answer_schemas",
    "split_frame",
    "subject_of",
    "writer_lookup",
]

MAGIC = b"\x00"
#: Magic byte and schema id: the body starts here.
FRAME_LEN = 5
_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
#: The registry's error code for "schema not found" (HTTP 404).
_SCHEMA_NOT_FOUND = 40403


def frame_header(schema_id: int) -> bytes:
    """The 5 bytes that precede an Avro body written with schema ``schema_id``."""
    return MAGIC + schema_id.to_bytes(4, "big")


def split_frame(data: bytes) -> int:
    """The schema id of a Confluent-framed value (its body starts at :data:`FRAME_LEN`).

    Raises DecodeError when ``data`` does not start with the magic byte or is too short.
    """
    if len(data) < FRAME_LEN or data[0] != 0:
        raise DecodeError(
            "not Confluent Schema Registry framing: expected magic byte 00 and a 4-byte "
            f"schema id, got {data[:FRAME_LEN].hex() or 'nothing'}"
        )
    return int.from_bytes(data[1:FRAME_LEN], "big")


def subject_of(topic: str) -> str:
    """The topic-name strategy's value subject (confluent-kafka's default)."""
    return f"{topic}-value"


@dataclass(frozen=True)
class WriterSchema:
    """A schema the registry holds: its id, text and parsed (fastavro) form."""

    schema_id: int
    text: str
    parsed: Any


class RegistryClient:
    """Blocking HTTP client of one registry (see the module's promise). Thread-safe:
    each call opens its own connection."""

    def __init__(self, settings: RegistrySettings) -> None:
        if not settings.enabled:
            raise ConfigurationError("no Schema Registry configured: set PIPELINE_REGISTRY_URL")
        self.settings = settings
        self.urls = settings.urls
        self._headers = {"Accept": _CONTENT_TYPE, "Content-Type": _CONTENT_TYPE}
        if settings.basic_auth_user_info:
            token = base64.b64encode(settings.basic_auth_user_info.reveal().encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        self._context: ssl.SSLContext | None = None
        if any(url.startswith("https://") for url in self.urls):
            ctx = ssl.create_default_context(cafile=settings.ca_file or None)
            if settings.cert_file:
                ctx.load_cert_chain(
                    settings.cert_file,
                    settings.key_file or None,
                    settings.key_password.reveal() or None,
                )
            self._context = ctx

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One request, to each URL in turn until one answers as a registry. Returns the
        decoded JSON; raises UnknownSchemaId for "schema not found" (40403),
        RegistryUnavailable for anything that is no registry's answer."""
        data = None if body is None else json.dumps(body).encode()
        failures: list[str] = []
        for url in self.urls:
            request = urllib.request.Request(
                url + path, data=data, method=method, headers=self._headers
            )
            try:
                with urllib.request.urlopen(
                    request, timeout=self.settings.timeout_s, context=self._context
                ) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                try:
                    answer = json.loads(exc.read() or b"{}")
                except ValueError:
                    answer = {}
                code = answer.get("error_code") if isinstance(answer, dict) else None
                if exc.code == 404 and code == _SCHEMA_NOT_FOUND:
                    raise UnknownSchemaId(
                        f"the Schema Registry has no schema {path.rsplit('/', 1)[-1]}"
                    ) from exc
                message = answer.get("message", exc.reason) if isinstance(answer, dict) else ""
                if exc.code in (401, 403):
                    message = (
                        f"credentials refused ({message}); "
                        "check PIPELINE_REGISTRY_BASIC_AUTH_USER_INFO"
                    )
                if 400 <= exc.code < 500 and exc.code not in (401, 403, 404, 408, 429):
                    # The registry refused the request itself (an invalid schema, say).
                    raise UnknownSchemaId(f"{method} {path}: {exc.code} {message}") from exc
                failures.append(f"{url}: HTTP {exc.code} {message}")
            except (OSError, ValueError) as exc:  # refused, timed out, TLS, not JSON
                failures.append(f"{url}: {type(exc).__name__}: {exc}")
        raise RegistryUnavailable(f"{method} {path}: " + "; ".join(failures))

    def schema(self, schema_id: int) -> WriterSchema:
        """The Avro schema registered with ``schema_id``, parsed.

        Raises UnknownSchemaId when the registry has none by that id, or holds one
        this pipeline cannot read (Protobuf, JSON Schema, Avro with references, a
        text fastavro cannot parse); RegistryUnavailable when it does not answer.
        """
        answer = self._call("GET", f"/schemas/ids/{schema_id}")
        if not isinstance(answer, dict) or not isinstance(answer.get("schema"), str):
            raise RegistryUnavailable(f"GET /schemas/ids/{schema_id}: not a registry's answer")
        kind = answer.get("schemaType", "AVRO") or "AVRO"
        if kind != "AVRO":
            raise UnknownSchemaId(
                f"schema {schema_id} is a {kind} schema; this pipeline reads Avro only"
            )
        if answer.get("references"):
            raise UnknownSchemaId(
                f"schema {schema_id} has references, which this pipeline does not resolve"
            )
        text = answer["schema"]
        try:
            parsed = fastavro.parse_schema(json.loads(text))
        except Exception as exc:  # fastavro raises several types for a bad schema
            raise UnknownSchemaId(
                f"schema {schema_id} is no Avro schema fastavro can parse: {exc}"
            ) from exc
        return WriterSchema(schema_id, text, parsed)

    def register(self, subject: str, schema_text: str) -> int:
        """Register ``schema_text`` (Avro JSON) under ``subject``; return its id (the
        existing one when the registry holds it already)."""
        answer = self._call("POST", f"/subjects/{subject}/versions", {"schema": schema_text})
        if not isinstance(answer, dict) or not isinstance(answer.get("id"), int):
            raise RegistryUnavailable(f"POST /subjects/{subject}/versions: no id in {answer!r}")
        return int(answer["id"])


class SchemaCache:
    """Writer schemas by id for a blocking reader (``pipeline answers``, replay): each
    id asked of the registry once. Call it as ``writer_of`` of
    :meth:`pipeline.codecs.avro.Codec.decode_any`."""

    def __init__(self, settings: RegistrySettings) -> None:
        self._client = RegistryClient(settings)
        self._known: dict[int, Any] = {}

    def __call__(self, schema_id: int) -> Any:
        parsed = self._known.get(schema_id)
        if parsed is None:
            parsed = self._known[schema_id] = self._client.schema(schema_id).parsed
        return parsed


def writer_lookup(settings: RegistrySettings) -> SchemaCache | None:
    """A :class:`SchemaCache` when a registry is configured, else None."""
    return SchemaCache(settings) if settings.enabled else None


@dataclass(frozen=True)
class AnswerHeaders:
    """The Confluent frame headers of the worker's results and dead letters."""

    result: bytes
    dead_letter: bytes


def register_answer_schemas(settings: Settings) -> AnswerHeaders | None:
    """With ``PIPELINE_REGISTRY_ANSWER_FRAMING=registry``: register the current
    InferenceResult and DeadLetter schemas under ``<results topic>-value`` and
    ``<dead-letter topic>-value`` (the topic-name strategy's subjects, where
    confluent-kafka's ``AvroDeserializer`` users expect them) and return their frame
    headers; None with the default framing. Blocking: call it before serving.

    Raises ConfigurationError (one line) when the registry refuses or does not answer.
    """
    from pipeline.codecs.avro import dead_letter_codec, result_codec

    reg = settings.registry
    if reg.answer_framing != "registry":
        return None
    client = RegistryClient(reg)
    headers = []
    for topic, codec in (
        (settings.topics.results_topic, result_codec()),
        (settings.topics.dlq_topic, dead_letter_codec()),
    ):
        text = json.dumps(json.loads(codec.current.path.read_text(encoding="utf-8")))
        try:
            headers.append(frame_header(client.register(subject_of(topic), text)))
        except (RegistryUnavailable, DecodeError) as exc:
            raise ConfigurationError(
                f"PIPELINE_REGISTRY_ANSWER_FRAMING=registry: cannot register {codec.current.name} "
                f"under {subject_of(topic)} at {reg.url}: {exc}"
            ) from exc
    return AnswerHeaders(result=headers[0], dead_letter=headers[1])
