"""Settings of the Confluent-compatible Schema Registry the pipeline reads and writes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pipeline.errors import ConfigurationError
from pipeline.settings._fields import _field
from pipeline.settings.kafka import Secret

#: How the worker frames results and dead letters (``answer_framing``).
ANSWER_FRAMINGS = ("single-object", "registry")


@dataclasses.dataclass(frozen=True)
class RegistrySettings:
    """Where the Schema Registry is and how to reach it; the names follow confluent-kafka's
    ``SchemaRegistryClient`` options (url, basic.auth.user.info, ssl.*.location)."""

    url: str = _field(
        "",
        "Schema Registry URL(s), http[s]://host:port[,...] (tried in turn); empty: a lane "
        "record in its framing (magic byte 00) is dead-lettered",
    )
    basic_auth_user_info: Secret = dataclasses.field(
        default=Secret(),
        metadata={"help": "user:password for HTTP basic auth (never printed or logged)"},
    )
    ca_file: str = _field("", "TLS: PEM file of the CA(s) that signed the registry's certificate")
    cert_file: str = _field("", "TLS: PEM client certificate, for registries that require one")
    key_file: str = _field("", "TLS: PEM private key of cert_file")
    key_password: Secret = dataclasses.field(
        default=Secret(), metadata={"help": "TLS: password of an encrypted key_file"}
    )
    timeout_s: float = _field(5.0, "longest wait for one registry request")
    retry_backoff_ms: int = _field(
        200, "first wait before asking a registry that did not answer again; doubled per try"
    )
    retry_backoff_max_ms: int = _field(
        5000,
        "longest wait between tries; the records behind an unknown schema id wait "
        "(never dead-lettered) until the registry answers",
    )
    answer_framing: str = _field(
        "single-object",
        "results and dead letters: single-object (Avro single-object encoding) or registry "
        "(Confluent framing; schemas registered under <topic>-value at start-up)",
    )

    def __post_init__(self) -> None:
        var, problems = "PIPELINE_REGISTRY_", []
        for url in self.urls:
            if not url.startswith(("http://", "https://")):
                problems.append(f"{var}URL: {url!r} is not an http:// or https:// URL")
        if self.basic_auth_user_info and ":" not in self.basic_auth_user_info.reveal():
            problems.append(f"{var}BASIC_AUTH_USER_INFO: expected user:password")
        files = {"CA_FILE": self.ca_file, "CERT_FILE": self.cert_file, "KEY_FILE": self.key_file}
        for name, path in files.items():
            if path and not Path(path).expanduser().is_file():
                problems.append(f"{var}{name}={path!r} is not a readable file")
        if bool(self.cert_file) != bool(self.key_file):
            problems.append(f"a client certificate needs both {var}CERT_FILE and {var}KEY_FILE")
        if self.timeout_s <= 0:
            problems.append(f"{var}TIMEOUT_S={self.timeout_s}: expected > 0")
        if not 0 < self.retry_backoff_ms <= self.retry_backoff_max_ms:
            problems.append(f"{var}RETRY_BACKOFF_MS: expected 0 < it <= RETRY_BACKOFF_MAX_MS")
        if self.answer_framing not in ANSWER_FRAMINGS:
            problems.append(
                f"{var}ANSWER_FRAMING={self.answer_framing!r}: expected "
                + " or ".join(ANSWER_FRAMINGS)
            )
        elif self.answer_framing == "registry" and not self.urls:
            problems.append(f"{var}ANSWER_FRAMING=registry needs {var}URL")
        if problems:
            raise ConfigurationError("; ".join(problems))

    @property
    def urls(self) -> list[str]:
        """The configured URLs, without trailing slashes."""
        return [u.strip().rstrip("/") for u in self.url.split(",") if u.strip()]

    @property
    def enabled(self) -> bool:
        return bool(self.urls)
