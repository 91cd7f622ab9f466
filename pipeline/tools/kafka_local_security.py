"""The local broker's secured listeners: SASL_PLAINTEXT and SASL_SSL, their users and TLS.

:class:`~pipeline.tools.kafka_local.LocalKafka` always listens in PLAINTEXT (also the
broker's own listener); ``sasl_port`` and ``tls_port`` add a SASL_PLAINTEXT and
a SASL_SSL listener. Both take PLAIN and SCRAM-SHA-256/512 logins for
``users``:

- :func:`security_listeners`: the extra listeners that are on, as (name, port);
- :func:`listener_properties`: their ``server.properties`` lines: the JAAS
  configuration per mechanism (PLAIN users inline) and, for SASL_SSL, the PEM
  key store and, with ``tls_ca_file``, a trust store that demands client
  certificates;
- :func:`scram_format_args`: the ``kafka-storage format --add-scram``
  arguments that store the SCRAM users when the storage is formatted.

The properties hold the PLAIN passwords and the TLS key: the file they go to
is the caller's to keep private.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.settings import LocalKafkaSettings

__all__ = ["listener_properties", "scram_format_args", "security_listeners"]

_SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
_PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule required"


def security_listeners(s: LocalKafkaSettings) -> list[tuple[str, int]]:
    """The SASL_PLAINTEXT / SASL_SSL listeners that are on, as (name, port)."""
    listeners = (("SASL_PLAINTEXT", s.sasl_port), ("SASL_SSL", s.tls_port))
    return [(name, port) for name, port in listeners if port]


def _pem_inline(path: str) -> str:
    """A PEM file as one properties value (``\\n`` escapes stand for the newlines)."""
    return Path(path).expanduser().read_text().strip().replace("\n", "\\n")


def listener_properties(s: LocalKafkaSettings) -> dict[str, str]:
    """The extra SASL_PLAINTEXT / SASL_SSL listeners' properties (none when off)."""
    names = [name for name, _ in security_listeners(s)]
    if not names:
        return {}
    plain_users = " ".join(f'user_{name}="{pw}"' for name, pw in s.user_list())
    props = {"sasl.enabled.mechanisms": ",".join(("PLAIN", *_SCRAM_MECHANISMS))}
    for name in names:
        prefix = f"listener.name.{name.lower()}."
        props[prefix + "plain.sasl.jaas.config"] = f"{_PLAIN_MODULE} {plain_users};"
        for mechanism in _SCRAM_MECHANISMS:
            props[prefix + mechanism.lower() + ".sasl.jaas.config"] = _SCRAM_MODULE
    if s.tls_port:
        prefix = "listener.name.sasl_ssl."
        props[prefix + "ssl.keystore.type"] = "PEM"
        props[prefix + "ssl.keystore.certificate.chain"] = _pem_inline(s.tls_cert_file)
        props[prefix + "ssl.keystore.key"] = _pem_inline(s.tls_key_file)
        if s.tls_ca_file:
            props[prefix + "ssl.truststore.type"] = "PEM"
            props[prefix + "ssl.truststore.certificates"] = _pem_inline(s.tls_ca_file)
            props[prefix + "ssl.client.auth"] = "required"
    return props


def scram_format_args(s: LocalKafkaSettings) -> list[str]:
    """``--add-scram`` arguments for ``kafka-storage format``: each user, each SCRAM mechanism."""
    args: list[str] = []
    for name, password in s.user_list():
        for mechanism in _SCRAM_MECHANISMS:
            args += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
    return args
