"""Settings of the Kafka clients, their security, the local broker and the topics."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pipeline.errors import ConfigurationError
from pipeline.settings._fields import KAFKA_VERSION, _default_cache, _field
from pipeline.settings.lanes import LANES


@dataclasses.dataclass(frozen=True)
class KafkaSettings:
    """How every client (worker, producer, replay, bench) reaches the brokers."""

    bootstrap_servers: str = _field("127.0.0.1:9092", "Kafka bootstrap servers, host:port[,...]")
    client_id: str = _field("inference-pipeline", "client.id sent to the brokers")
    fetch_max_wait_ms: int = _field(
        100,
        "worker: longest the broker holds a fetch that found no new record; a lane partition "
        "paused while its lane was full is fetched again at most about this long after it "
        "resumes (Faust's own: 1500)",
    )
    isolation_level: str = _field(
        "read_committed",
        "worker: read_committed (records of aborted transactions are never answered, and "
        "nothing past an open transaction is read until it ends) or read_uncommitted "
        "(every record is answered, aborted ones too; Faust's own without exactly_once)",
    )

    def __post_init__(self) -> None:
        if self.isolation_level not in ("read_committed", "read_uncommitted"):
            raise ConfigurationError(
                f"PIPELINE_KAFKA_ISOLATION_LEVEL={self.isolation_level!r}: expected "
                "read_committed or read_uncommitted"
            )
        if not 0 <= self.fetch_max_wait_ms <= 60_000:
            raise ConfigurationError(
                f"PIPELINE_KAFKA_FETCH_MAX_WAIT_MS={self.fetch_max_wait_ms}: expected 0..60000 ms"
            )


class Secret:
    """A string that never shows itself: ``str`` and ``repr`` give ``***`` ('' when
    empty), so a settings object can be printed or logged whole. ``reveal()`` is
    for the one place that hands the value to a client library."""

    __slots__ = ("_value",)

    def __init__(self, value: str = "") -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __str__(self) -> str:
        return "***" if self._value else ""

    def __repr__(self) -> str:
        return "'***'" if self._value else "''"


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclasses.dataclass(frozen=True)
class KafkaSecuritySettings:
    """How every client (worker, producer, replay, bench, admin) authenticates to the
    brokers and checks them; ``pipeline.kafka.security`` turns it into each library's options."""

    protocol: str = _field("PLAINTEXT", "PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL")
    sasl_mechanism: str = _field("SCRAM-SHA-512", "SASL: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
    username: str = _field("", "SASL: user name")
    password: Secret = dataclasses.field(
        default=Secret(), metadata={"help": "SASL: password (never printed or logged)"}
    )
    ca_file: str = _field(
        "", "TLS: PEM file of the CA(s) that signed the brokers' certificates; empty: the system's"
    )
    cert_file: str = _field("", "TLS: PEM client certificate, for brokers that require one")
    key_file: str = _field("", "TLS: PEM private key of cert_file")
    key_password: Secret = dataclasses.field(
        default=Secret(), metadata={"help": "TLS: password of an encrypted key_file"}
    )
    check_hostname: bool = _field(True, "TLS: a broker's certificate must name the host dialled")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    def __post_init__(self) -> None:
        var, problems = "PIPELINE_KAFKA_SECURITY_", []
        if self.protocol not in SECURITY_PROTOCOLS:
            problems.append(
                f"{var}PROTOCOL={self.protocol!r}: expected one of " + ", ".join(SECURITY_PROTOCOLS)
            )
        if self.sasl_mechanism not in SASL_MECHANISMS:
            problems.append(
                f"{var}SASL_MECHANISM={self.sasl_mechanism!r}: expected one of "
                + ", ".join(SASL_MECHANISMS)
            )
        if self.sasl and not (self.username and self.password):
            problems.append(f"{self.protocol} needs {var}USERNAME and {var}PASSWORD")
        if not self.sasl and (self.username or self.password):
            problems.append(
                f"{var}USERNAME/PASSWORD are set but {self.protocol} sends no credentials; "
                f"set {var}PROTOCOL=SASL_SSL (or SASL_PLAINTEXT)"
            )
        files = {"CA_FILE": self.ca_file, "CERT_FILE": self.cert_file, "KEY_FILE": self.key_file}
        given = [name for name, path in files.items() if path] + (
            ["KEY_PASSWORD"] if self.key_password else []
        )
        if given and not self.tls:
            problems.append(
                f"{', '.join(var + g for g in given)} set but {self.protocol} does not use TLS; "
                f"set {var}PROTOCOL=SSL or SASL_SSL"
            )
        for name, path in files.items():
            if path and not Path(path).expanduser().is_file():
                problems.append(f"{var}{name}={path!r} is not a readable file")
        if bool(self.cert_file) != bool(self.key_file):
            problems.append(f"a client certificate needs both {var}CERT_FILE and {var}KEY_FILE")
        if self.key_password and not self.key_file:
            problems.append(f"{var}KEY_PASSWORD is set without {var}KEY_FILE")
        if problems:
            raise ConfigurationError("; ".join(problems))


@dataclasses.dataclass(frozen=True)
class LocalKafkaSettings:
    """The embedded single-node broker that ``pipeline kafka up`` runs (no Docker)."""

    version: str = _field(KAFKA_VERSION, "Apache Kafka release resolved from Maven Central")
    port: int = _field(9092, "client port of the local broker (loopback)")
    controller_port: int = _field(0, "KRaft controller port; 0 means port + 1")
    data_dir: str = _field(
        str(Path(_default_cache()) / "kafka-data"), "folder for the broker's logs and pid file"
    )
    cache_dir: str = _field(
        str(Path(_default_cache()) / "kafka-jars"), "folder where the broker's jars are cached"
    )
    heap: str = _field("512m", "JVM heap of the local broker (-Xmx)")
    start_timeout_s: float = _field(90.0, "seconds to wait for the broker to answer")
    sasl_port: int = _field(0, "extra SASL_PLAINTEXT listener (PLAIN, SCRAM-SHA-256/512); 0: off")
    tls_port: int = _field(0, "extra SASL_SSL listener (needs tls_cert_file, tls_key_file); 0: off")
    users: Secret = dataclasses.field(
        default=Secret(),
        metadata={"help": "SASL users name:password[,...]; SCRAM ones are added at format time"},
    )
    tls_cert_file: str = _field("", "PEM certificate (chain) of the SASL_SSL listener")
    tls_key_file: str = _field("", "PEM private key (PKCS#8, unencrypted) of tls_cert_file")
    tls_ca_file: str = _field("", "PEM CA; if set, SASL_SSL clients need a certificate it signed")

    def __post_init__(self) -> None:
        var, problems = "PIPELINE_LOCAL_KAFKA_", []
        if (self.sasl_port or self.tls_port) and not self.users:
            problems.append(f"a SASL listener needs {var}USERS (name:password[,...])")
        if self.tls_port and not (self.tls_cert_file and self.tls_key_file):
            problems.append(f"{var}TLS_PORT needs {var}TLS_CERT_FILE and {var}TLS_KEY_FILE")
        for pair in filter(None, self.users.reveal().split(",")):
            name, sep, password = pair.partition(":")
            if not sep or not name or not password or any(c in pair for c in '"\\=[]'):
                problems.append(f'{var}USERS: each entry is name:password, without " \\ = [ ]')
                break
        if problems:
            raise ConfigurationError("; ".join(problems))

    def user_list(self) -> list[tuple[str, str]]:
        """``users`` parsed: ``[(name, password), ...]``."""
        pairs = (p.partition(":") for p in self.users.reveal().split(",") if p)
        return [(name, password) for name, _, password in pairs]


@dataclasses.dataclass(frozen=True)
class TopicSettings:
    """Topic names and layout. Lanes share one partition count (co-partitioned)."""

    prefix: str = _field("", "prefix added to every topic name, e.g. 'staging.'")
    realtime: str = _field("inference.requests.realtime", "realtime lane topic")
    standard: str = _field("inference.requests.standard", "standard lane topic")
    bulk: str = _field("inference.requests.bulk", "bulk lane topic")
    results: str = _field("inference.results", "results topic")
    dlq: str = _field("inference.dlq", "dead-letter topic")
    partitions: int = _field(3, "partitions of every topic (lanes must match)")
    replication: int = _field(1, "replication factor of created topics")
    retention_ms: int = _field(7 * 24 * 3600 * 1000, "retention of request and result topics")
    dlq_retention_ms: int = _field(30 * 24 * 3600 * 1000, "retention of the dead-letter topic")

    def lane_topic(self, lane: str) -> str:
        """The full topic name of a lane (``realtime``, ``standard`` or ``bulk``)."""
        if lane not in LANES:
            raise ConfigurationError(f"unknown lane {lane!r}; expected one of {', '.join(LANES)}")
        return self.prefix + str(getattr(self, lane))

    @property
    def results_topic(self) -> str:
        return self.prefix + self.results

    @property
    def dlq_topic(self) -> str:
        return self.prefix + self.dlq

    def all_topics(self) -> list[str]:
        """Every topic the pipeline uses, lanes first."""
        return [self.lane_topic(lane) for lane in LANES] + [self.results_topic, self.dlq_topic]
