"""The registry client against the real registry server (franz-go's srfake, the
``schema_registry`` fixture; no broker): what each answer means to the pipeline.

- a schema registered is read back by id, parsed; the same text registers to
  the same id; ids it does not hold, and schemas that are not Avro, are the
  input's fault (UnknownSchemaId);
- a registry that is down, refuses our credentials, or whose certificate we
  cannot verify is not (RegistryUnavailable), and the next URL is tried;
- basic auth and TLS (a CA made here with openssl) as the settings give them;
- the answer schemas are registered under the topic-name subjects, or the
  worker gets one line saying why not;
- the blocking readers' cache asks for each id once.
"""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.request
from pathlib import Path

import pytest
from support import free_ports

from pipeline.codecs.avro import SCHEMA_DIR
from pipeline.codecs.registry import (
    RegistryClient,
    SchemaCache,
    frame_header,
    register_answer_schemas,
)
from pipeline.errors import ConfigurationError, RegistryUnavailable, UnknownSchemaId
from pipeline.settings import RegistrySettings, Secret, Settings, TopicSettings
from pipeline.tools.registry_local import LocalRegistry, RunningRegistry

CURRENT = (SCHEMA_DIR / "InferenceRequest.avsc").read_text()
V1 = (SCHEMA_DIR / "history" / "InferenceRequest.v1.avsc").read_text()


def _client(url: str, **fields: object) -> RegistryClient:
    return RegistryClient(RegistrySettings(url=url, timeout_s=2.0, **fields))  # type: ignore[arg-type]


def _nobody() -> str:
    """A loopback URL nothing listens on."""
    return f"http://127.0.0.1:{free_ports(1)[0]}"


def test_schemas_registered_are_read_back_by_id(schema_registry: RunningRegistry) -> None:
    client = _client(schema_registry.url)
    first = client.register("lane-value", CURRENT)
    older = client.register("lane-value", V1)
    assert first != older
    assert client.register("lane-value", CURRENT) == first  # the same text: the same id
    got = client.schema(older)
    assert got.schema_id == older and json.loads(got.text)["fields"][0]["name"] == "request_id"
    assert got.parsed["name"] == "pipeline.InferenceRequest"
    with pytest.raises(UnknownSchemaId, match="no schema 4242"):
        client.schema(4242)


def test_a_schema_that_is_not_avro_is_the_inputs_fault(schema_registry: RunningRegistry) -> None:
    body = json.dumps({"schema": '{"type": "object"}', "schemaType": "JSON"}).encode()
    request = urllib.request.Request(
        f"{schema_registry.url}/subjects/json-value/versions",
        data=body,
        method="POST",
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        schema_id = json.loads(resp.read())["id"]
    with pytest.raises(UnknownSchemaId, match="JSON schema; this pipeline reads Avro only"):
        _client(schema_registry.url).schema(schema_id)


def test_a_registry_that_does_not_answer_is_not_the_inputs_fault(
    schema_registry: RunningRegistry,
) -> None:
    down = _nobody()
    with pytest.raises(RegistryUnavailable, match=r"ConnectionRefused|Connection refused"):
        _client(down).schema(1)
    # The next URL is tried.
    schema_id = _client(schema_registry.url).register("lane-value", CURRENT)
    assert _client(f"{down},{schema_registry.url}").schema(schema_id).schema_id == schema_id


def test_basic_auth(local_registry: LocalRegistry) -> None:
    token = base64.b64encode(b"alice:s3cret").decode()
    with local_registry.start(auth=f"Basic {token}") as registry:
        good = _client(registry.url, basic_auth_user_info=Secret("alice:s3cret"))
        schema_id = good.register("lane-value", CURRENT)
        assert good.schema(schema_id).schema_id == schema_id
        bad = _client(registry.url, basic_auth_user_info=Secret("alice:wrong"))
        with pytest.raises(RegistryUnavailable, match="credentials refused"):
            bad.schema(schema_id)
        with pytest.raises(RegistryUnavailable, match="HTTP 401"):
            _client(registry.url).schema(schema_id)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _certs(d: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate it signed for 127.0.0.1."""
    ca_key, ca, key, csr, cert = (d / n for n in ("ca.key", "ca.pem", "s.key", "s.csr", "s.pem"))
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
        "-days",
        "2",
        "-subj",
        "/CN=test registry ca",
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(csr),
        "-subj",
        "/CN=127.0.0.1",
    )
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-out",
        str(cert),
        "-days",
        "2",
        "-extfile",
        str(d / "san.ext"),
    )
    return ca, cert, key


def test_tls_verifies_the_registry_against_the_ca_file(
    local_registry: LocalRegistry, tmp_path: Path
) -> None:
    ca, cert, key = _certs(tmp_path)
    with local_registry.start(tls=(str(cert), str(key))) as registry:
        assert registry.url.startswith("https://")
        trusted = _client(registry.url, ca_file=str(ca))
        schema_id = trusted.register("lane-value", CURRENT)
        assert trusted.schema(schema_id).schema_id == schema_id
        with pytest.raises(RegistryUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            _client(registry.url).schema(schema_id)  # the system's CAs do not know ours


def test_answer_schemas_are_registered_under_the_topic_subjects(
    schema_registry: RunningRegistry,
) -> None:
    topics = TopicSettings(prefix="p.")
    plain = Settings().replace(topics=topics)
    assert register_answer_schemas(plain) is None  # the default framing: nothing registered
    settings = plain.replace(
        registry=RegistrySettings(url=schema_registry.url, answer_framing="registry")
    )
    headers = register_answer_schemas(settings)
    assert headers is not None
    client = _client(schema_registry.url)
    result_id = client.register(
        "p.inference.results-value", (SCHEMA_DIR / "InferenceResult.avsc").read_text()
    )
    assert headers.result == frame_header(result_id)
    assert client.schema(int.from_bytes(headers.dead_letter[1:], "big")).parsed["name"] == (
        "pipeline.DeadLetter"
    )
    down = settings.replace(registry=RegistrySettings(url=_nobody(), answer_framing="registry"))
    with pytest.raises(ConfigurationError) as failed:
        register_answer_schemas(down)
    assert "cannot register InferenceResult under p.inference.results-value" in str(failed.value)
    assert "\n" not in str(failed.value)


def test_the_readers_cache_asks_for_each_id_once(local_registry: LocalRegistry) -> None:
    registry = local_registry.start()
    try:
        schema_id = _client(registry.url).register("lane-value", CURRENT)
        cache = SchemaCache(RegistrySettings(url=registry.url, timeout_s=2.0))
        parsed = cache(schema_id)
    finally:
        registry.stop()
    assert cache(schema_id) is parsed  # the registry is gone: served from the cache
    with pytest.raises(RegistryUnavailable):
        cache(schema_id + 1)
