"""Secure connections: ``PIPELINE_KAFKA_SECURITY_*`` as each Kafka client's options.

Every Kafka client the pipeline builds takes its options from here, so the
worker (Faust on aiokafka), the producer, the replay command, the benchmark
and the admin calls all connect the same way:

- :func:`client_config`: confluent-kafka (librdkafka) options, ``bootstrap.servers``
  included; callers add their own (``{**client_config(s), "group.id": ...}``);
- :func:`faust_credentials`: the Faust app's ``broker_credentials``;
- :class:`AuthWatch` and :func:`connect`: librdkafka retries a refused login or
  a failed TLS handshake until some timeout; these raise
  :class:`~pipeline.errors.AuthenticationFailed` as soon as it is reported;
- :func:`security_env`: the same settings as variables, for worker processes a
  command starts.

Passwords leave their :class:`~pipeline.settings.Secret` only into these
options, never into a message.
"""

from __future__ import annotations

import dataclasses
import ssl
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from pipeline.errors import AuthenticationFailed, BrokerUnavailable, ConfigurationError
from pipeline.settings import PREFIX, KafkaSecuritySettings, Secret, Settings

__all__ = [
    "AuthWatch",
    "client_config",
    "connect",
    "faust_credentials",
    "security_env",
    "ssl_context",
]

_VAR = f"{PREFIX}KAFKA_SECURITY_"


def client_config(settings: Settings, watch: AuthWatch | None = None) -> dict[str, Any]:
    """``bootstrap.servers`` and the security options of a confluent-kafka client;
    with ``watch``, also its ``error_cb``."""
    sec = settings.kafka_security
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.kafka.bootstrap_servers,
        "security.protocol": sec.protocol,
    }
    if sec.sasl:
        conf["sasl.mechanisms"] = sec.sasl_mechanism
        conf["sasl.username"] = sec.username
        conf["sasl.password"] = sec.password.reveal()
    if sec.tls:
        conf["ssl.endpoint.identification.algorithm"] = "https" if sec.check_hostname else "none"
        if sec.ca_file:
            conf["ssl.ca.location"] = sec.ca_file
        if sec.cert_file:
            conf["ssl.certificate.location"] = sec.cert_file
            conf["ssl.key.location"] = sec.key_file
        if sec.key_password:
            conf["ssl.key.password"] = sec.key_password.reveal()
    if watch is not None:
        conf["error_cb"] = watch
    return conf


def ssl_context(sec: KafkaSecuritySettings) -> ssl.SSLContext:
    """A client TLS context: verifies the brokers against ``ca_file`` (else the
    system's CAs), their host names unless ``check_hostname`` is off, and shows
    the client certificate when one is set."""
    try:
        ctx = ssl.create_default_context(cafile=sec.ca_file or None)
        ctx.check_hostname = sec.check_hostname
        if sec.cert_file:
            password = sec.key_password.reveal() or None
            ctx.load_cert_chain(sec.cert_file, sec.key_file, password=password)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(
            f"cannot load the TLS files ({exc}); check {_VAR}CA_FILE, {_VAR}CERT_FILE, "
            f"{_VAR}KEY_FILE and {_VAR}KEY_PASSWORD"
        ) from exc
    return ctx


def faust_credentials(sec: KafkaSecuritySettings) -> Any:
    """``broker_credentials`` for ``faust.App``: SASL (over TLS for SASL_SSL), TLS
    alone, or None for PLAINTEXT. Faust hands them to every aiokafka client."""
    import faust

    if sec.sasl:
        return faust.SASLCredentials(
            username=sec.username,
            password=sec.password.reveal(),
            mechanism=sec.sasl_mechanism,
            ssl_context=ssl_context(sec) if sec.tls else None,
        )
    if sec.tls:
        return faust.SSLCredentials(ssl_context(sec))
    return None


def security_env(settings: Settings) -> dict[str, str]:
    """The ``PIPELINE_KAFKA_SECURITY_*`` variables that reproduce ``settings``'
    security section in a child process (only those that differ from the default)."""
    env: dict[str, str] = {}
    for field in dataclasses.fields(KafkaSecuritySettings):
        value = getattr(settings.kafka_security, field.name)
        if value == field.default:
            continue
        if isinstance(value, Secret):
            value = value.reveal()
        elif isinstance(value, bool):
            value = "true" if value else "false"
        env[f"{_VAR}{field.name.upper()}"] = str(value)
    return env


class AuthWatch:
    """An ``error_cb`` that remembers the first authentication or TLS failure
    librdkafka reports, and the last error of any kind (for timeout messages)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.failure: AuthenticationFailed | None = None
        self.last_error = ""

    def __call__(self, err: KafkaError) -> None:
        self.last_error = str(err.str())
        if self.failure is None:
            self.failure = auth_failure(err, self.settings)

    def check(self) -> None:
        """Raise the failure seen so far, if any."""
        if self.failure is not None:
            raise self.failure


def auth_failure(err: KafkaError, settings: Settings) -> AuthenticationFailed | None:
    """The pipeline's error for a librdkafka error that no retry can fix, else None."""
    sec, boot = settings.kafka_security, settings.kafka.bootstrap_servers
    text, code = str(err.str()), err.code()
    if code == KafkaError._AUTHENTICATION:
        return AuthenticationFailed(
            f"authentication failed: the broker at {boot} refused {sec.sasl_mechanism} user "
            f"{sec.username!r} ({text}); check {_VAR}USERNAME, {_VAR}PASSWORD and "
            f"{_VAR}SASL_MECHANISM"
        )
    if code == KafkaError._SSL:
        return AuthenticationFailed(
            f"TLS handshake with {boot} failed ({text}); check that {_VAR}CA_FILE holds the CA "
            f"that signed the broker's certificate and that the certificate names the host "
            f"dialled ({_VAR}CHECK_HOSTNAME)"
        )
    if code == KafkaError._TRANSPORT and "alert" in text and "certificate" in text:
        return AuthenticationFailed(
            f"the broker at {boot} rejected the TLS handshake ({text}); it may require a client "
            f"certificate signed by a CA it trusts: check {_VAR}CERT_FILE and {_VAR}KEY_FILE"
        )
    return None


def connect(client: Any, watch: AuthWatch, timeout_s: float) -> Any:
    """``client.list_topics()`` until the cluster answers; return its metadata.

    ``client`` (admin, producer, or a consumer not yet subscribed) must have
    ``watch`` as its ``error_cb``. Raises AuthenticationFailed as soon as
    librdkafka reports one, BrokerUnavailable after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.list_topics(timeout=max(0.05, min(0.5, deadline - time.monotonic())))
        except KafkaException as exc:
            client.poll(0)  # serves error_cb
            watch.check()
            if time.monotonic() >= deadline:
                boot = watch.settings.kafka.bootstrap_servers
                raise BrokerUnavailable(
                    f"no broker answered at {boot} within {timeout_s:.0f} s "
                    f"({watch.last_error or exc}); start one with `pipeline kafka up`, or check "
                    f"{PREFIX}KAFKA_BOOTSTRAP_SERVERS and that {_VAR}PROTOCOL matches the "
                    "broker's listener"
                ) from exc
