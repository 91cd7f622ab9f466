"""One frozen settings object, read once from ``PIPELINE_*`` environment variables.

Each section is a frozen dataclass; a field ``FIELD`` of section ``SECTION`` is
read from ``PIPELINE_SECTION_FIELD`` (upper case). ``Settings.from_env()`` is
the only place in the package that reads ``os.environ``; everything else gets
the object passed down. ``pipeline settings`` prints every variable with its
default and help text, and the README lists them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

from pipeline.errors import ConfigurationError

__all__ = [
    "LANES",
    "BatchSettings",
    "BreakerSettings",
    "DedupeSettings",
    "DegradeSettings",
    "KafkaSecuritySettings",
    "KafkaSettings",
    "LocalKafkaSettings",
    "LogSettings",
    "MetricsSettings",
    "ModelSettings",
    "RetrySettings",
    "SchedulerSettings",
    "Secret",
    "Settings",
    "TopicSettings",
    "ValidationSettings",
    "WorkerSettings",
]

#: Priority lanes, highest first.
LANES: tuple[str, ...] = ("realtime", "standard", "bulk")

PREFIX = "PIPELINE_"
KAFKA_VERSION = "4.1.1"


def _default_cache() -> str:
    return str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pipeline")


def _field(default: Any, help: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class KafkaSettings:
    """How every client (worker, producer, replay, bench) reaches the brokers."""

    bootstrap_servers: str = _field("127.0.0.1:9092", "Kafka bootstrap servers, host:port[,...]")
    client_id: str = _field("inference-pipeline", "client.id sent to the brokers")


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
    brokers and checks them; ``pipeline.security`` turns it into each library's options."""

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
                problems.append(f"{var}USERS: each entry is name:password, without \" \\ = [ ]")
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


@dataclasses.dataclass(frozen=True)
class ValidationSettings:
    """Size caps on input; what breaks them is dead-lettered (stage ``validate``)."""

    max_payload_bytes: int = _field(65536, "largest request value accepted, in bytes")
    max_text_chars: int = _field(8192, "longest text accepted, in characters")


#: How the engine pads a batch (``ModelSettings.padding``).
PADDINGS: tuple[str, ...] = ("auto", "longest", "bucket", "shape")


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """Which model runs, where, and how."""

    path: str = _field("", "Hugging Face model folder; empty means the bundled all-MiniLM-L6-v2")
    name: str = _field("", "model name reported in results; empty means derived from the path")
    version: str = _field("1", "model version; stored results of another version are ignored")
    task: str = _field(
        "embed",
        "embed (mean-pooled, L2-normalised), classify (label, score), or noop (no model: a "
        "fixed tiny embedding, to measure the pipeline's own cost)",
    )
    device: str = _field("auto", "auto, cpu or cuda")
    max_length: int = _field(256, "tokens per text; longer texts are truncated")
    torch_threads: int = _field(
        0, "torch intra-op threads; 0 means cores - 1 (at least 1): the event loop keeps a core"
    )
    torch_interop_threads: int = _field(
        1, "torch inter-op threads (eager inference uses none; 0: cores - 1); fixed per process"
    )
    tokenizer_threads: int = _field(
        1,
        "tokenizer threads: 1 tokenizes on the engine's tokenizer thread alone "
        "(TOKENIZERS_PARALLELISM=false); N > 1 a rayon pool of N; 0 the library's (one per core)",
    )
    padding: str = _field(
        "auto",
        "longest (pad a batch to its longest text), bucket (to the scheduler's sequence bucket), "
        "shape (bucket, and rows up to the batch-size bucket); auto: bucket on CUDA, else longest",
    )
    fail_on: str = _field(
        "", "testing aid: a regex; texts matching it make the model raise (fault injection)"
    )

    def __post_init__(self) -> None:
        problems = []
        if self.padding not in PADDINGS:
            problems.append(f"PADDING={self.padding!r}: expected one of {', '.join(PADDINGS)}")
        for name in ("torch_threads", "torch_interop_threads", "tokenizer_threads"):
            if getattr(self, name) < 0:
                problems.append(f"{name.upper()}={getattr(self, name)}: must be >= 0")
        if problems:
            raise ConfigurationError("PIPELINE_MODEL_" + "; PIPELINE_MODEL_".join(problems))

    @property
    def display_name(self) -> str:
        """The model's name in results: ``name``, else the folder's name."""
        if self.name:
            return self.name
        if self.task == "noop":  # never shares content hashes or stored results with a model
            return "noop"
        return Path(self.path).name if self.path else "all-MiniLM-L6-v2"

    @property
    def model_id(self) -> str:
        """``name@version``: part of every content hash, so versions never share results."""
        return f"{self.display_name}@{self.version}"


@dataclasses.dataclass(frozen=True)
class BatchSettings:
    """Bounds on work between intake and acknowledgement (batches: see ``scheduler``)."""

    max_inflight: int = _field(
        2048, "per lane: most requests accepted but not yet acknowledged (then intake waits)"
    )
    stream_buffer: int = _field(
        1024,
        "per lane topic: records Faust may buffer ahead of the agent; bounds memory while "
        "a lane is paused (Faust then stops fetching its partitions)",
    )


@dataclasses.dataclass(frozen=True)
class RetrySettings:
    """Bounded retries with exponential backoff and full jitter."""

    max_attempts: int = _field(3, "tries of a failing input before it is dead-lettered")
    backoff_base_ms: int = _field(50, "first backoff, doubled per attempt")
    backoff_max_ms: int = _field(2000, "largest backoff")


@dataclasses.dataclass(frozen=True)
class DedupeSettings:
    """The stored-result level of dedupe (RocksDB table)."""

    ttl_s: int = _field(7 * 24 * 3600, "seconds a stored result stays valid")
    enabled: bool = _field(True, "serve repeated texts from stored results")


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    """The Faust worker process."""

    app_id: str = _field("inference-pipeline", "Faust app id (also the consumer group)")
    data_dir: str = _field(str(Path(_default_cache()) / "worker-data"), "folder for RocksDB tables")
    web_host: str = _field("127.0.0.1", "host the worker's web server binds to")
    web_port: int = _field(6066, "port of the worker's web server")
    lane_deadline_ms_realtime: int = _field(200, "default deadline of a realtime request")
    lane_deadline_ms_standard: int = _field(2000, "default deadline of a standard request")
    lane_deadline_ms_bulk: int = _field(60000, "default deadline of a bulk request")
    expire_lanes: str = _field(
        "realtime",
        "comma-separated lanes whose requests are dead-lettered (stage expired) instead of "
        "computed once their deadline has passed; other lanes run late",
    )
    log_payloads: bool = _field(False, "include request text in logs (off: never log payloads)")
    producer_linger_ms: int = _field(
        5, "results and dead letters wait up to this long to share one produce request"
    )
    event_loop: str = _field(
        "uvloop",
        "the worker's asyncio event loop: uvloop (a quarter less CPU per event) or asyncio",
    )

    def __post_init__(self) -> None:
        if self.event_loop not in {"uvloop", "asyncio"}:
            raise ConfigurationError(
                f"PIPELINE_WORKER_EVENT_LOOP={self.event_loop!r}: expected uvloop or asyncio"
            )

    def lane_deadline_ms(self, lane: str) -> int:
        return int(getattr(self, f"lane_deadline_ms_{lane}"))

    def expires(self, lane: str) -> bool:
        """Whether a late request of ``lane`` is expired rather than computed."""
        return lane in {x.strip() for x in self.expire_lanes.split(",")}


@dataclasses.dataclass(frozen=True)
class SchedulerSettings:
    """The adaptive micro-batch scheduler and its batch-size controller.

    Defaults follow DESIGN.md's CPU measurements: 8-16 short texts (about 32
    tokens each) per batch are the sweet spot, so a 512-token budget; the
    controller moves it between the bounds.
    """

    realtime_share: float = _field(
        0.25, "share of every batch reserved for realtime; unused room goes to the others"
    )
    token_budget: int = _field(
        512, "initial padded-token budget of a batch (batch size x bucketed sequence length)"
    )
    token_budget_min: int = _field(128, "smallest token budget the controller may set")
    token_budget_max: int = _field(16384, "largest token budget the controller may set")
    max_items: int = _field(32, "most requests in one batch")
    window_ms: int = _field(10, "longest wait for a batch to fill once its oldest request arrived")
    margin_ms: int = _field(5, "safety margin kept between a batch's predicted end and a deadline")
    max_wait_ms_standard: int = _field(
        1000, "a standard request waits at most this long for higher lanes (aging)"
    )
    max_wait_ms_bulk: int = _field(
        5000, "a bulk request waits at most this long for higher lanes (aging)"
    )
    queue_size: int = _field(512, "bound of each lane's queue; a full lane's topic is paused")
    resume_fraction: float = _field(
        0.5, "a paused lane resumes once its queue is down to this fraction of queue_size"
    )
    seq_buckets: str = _field(
        "16,32,64,128,256", "sequence-length buckets (tokens), ascending; batches pad to one"
    )
    policy: str = _field(
        "seed", "batch-size policy: seed (x0.8 / x1.2), aimd, or fixed (the budget never moves)"
    )
    latency_threshold: float = _field(
        0.5, "a batch is slow when it takes longer than this fraction of the realtime deadline"
    )
    slow_batches: int = _field(3, "seed policy: consecutive slow batches before the budget shrinks")
    shrink_factor: float = _field(0.8, "seed policy: budget factor after slow batches")
    grow_factor: float = _field(1.2, "seed policy: budget factor at low device utilisation")
    low_utilisation: float = _field(0.6, "device utilisation (0..1) below which the budget grows")
    aimd_step: int = _field(128, "aimd policy: tokens added per fast batch at low utilisation")
    aimd_decrease: float = _field(0.5, "aimd policy: budget factor after one slow batch")
    latency_overhead_ms: float = _field(
        12.0, "prior fixed cost of a batch in ms, until measured (2-core CPU, MiniLM)"
    )
    latency_ms_per_token: float = _field(
        0.2, "prior cost of one padded token in ms, until measured (2-core CPU, MiniLM)"
    )
    latency_alpha: float = _field(0.2, "weight of the newest batch in the latency model (EWMA)")
    handover_ms: float = _field(
        3.0,
        "the next batch is formed when the running one is predicted to end within this plus the "
        "engine's measured tokenisation time (so it is tokenised meanwhile); < 0: after it ended",
    )

    def __post_init__(self) -> None:
        problems = []
        if not 0.0 <= self.realtime_share < 1.0:
            problems.append("realtime_share must be in [0, 1)")
        if not 1 <= self.token_budget_min <= self.token_budget <= self.token_budget_max:
            problems.append("need 1 <= token_budget_min <= token_budget <= token_budget_max")
        if self.max_items < 1 or self.queue_size < 1 or self.slow_batches < 1:
            problems.append("max_items, queue_size and slow_batches must be at least 1")
        if not 0.0 <= self.resume_fraction < 1.0:
            problems.append("resume_fraction must be in [0, 1)")
        if self.policy not in {"seed", "aimd", "fixed"}:
            problems.append(f"policy {self.policy!r}: expected seed, aimd or fixed")
        if not (0 < self.shrink_factor < 1 and self.grow_factor > 1 and 0 < self.aimd_decrease < 1):
            problems.append("need 0 < shrink_factor, aimd_decrease < 1 < grow_factor")
        if not 0 < self.latency_alpha <= 1:
            problems.append("latency_alpha must be in (0, 1]")
        try:
            buckets = self.buckets
        except ValueError:
            buckets = ()
        if not buckets or buckets != tuple(sorted(set(buckets))) or buckets[0] < 1:
            problems.append(f"seq_buckets {self.seq_buckets!r}: expected ascending positive ints")
        if problems:
            raise ConfigurationError("PIPELINE_SCHEDULER_*: " + "; ".join(problems))

    @property
    def buckets(self) -> tuple[int, ...]:
        """``seq_buckets`` parsed: ascending sequence lengths in tokens."""
        return tuple(int(x) for x in self.seq_buckets.split(",") if x.strip())

    def max_wait_ms(self, lane: str) -> int | None:
        """How long a request of ``lane`` may wait for higher lanes (``None``: top lane)."""
        value = getattr(self, f"max_wait_ms_{lane}", None)
        return None if value is None else int(value)


@dataclasses.dataclass(frozen=True)
class MetricsSettings:
    """The worker's Prometheus endpoint (``pipeline.metrics``)."""

    enabled: bool = _field(True, "serve Prometheus metrics at http://HOST:PORT/metrics")
    host: str = _field("127.0.0.1", "host the metrics endpoint binds to (0.0.0.0 in containers)")
    port: int = _field(9108, "port of the metrics endpoint; 0 disables it (one per worker)")
    sample_interval_s: float = _field(
        5.0, "seconds between readings of gauges (queue depth, GPU, consumer lag)"
    )

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigurationError(f"PIPELINE_METRICS_PORT={self.port}: expected 0..65535")
        if self.sample_interval_s <= 0:
            raise ConfigurationError("PIPELINE_METRICS_SAMPLE_INTERVAL_S must be positive")


_LOG_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"})


@dataclasses.dataclass(frozen=True)
class LogSettings:
    """How the worker logs (``pipeline.logs``); payload text never appears unless
    ``PIPELINE_WORKER_LOG_PAYLOADS`` is on."""

    format: str = _field("text", "text (human) or json (one object per line, for collectors)")
    level: str = _field("", "root log level (DEBUG, INFO, ...); empty keeps the worker's -l")

    def __post_init__(self) -> None:
        if self.format not in {"text", "json"}:
            raise ConfigurationError(f"PIPELINE_LOG_FORMAT={self.format!r}: expected text or json")
        if self.level and self.level.upper() not in _LOG_LEVELS:
            raise ConfigurationError(f"PIPELINE_LOG_LEVEL={self.level!r}: not a log level")


@dataclasses.dataclass(frozen=True)
class DegradeSettings:
    """Load shedding when realtime misses its deadlines (``scheduling.degrade``).

    Levels, one step at a time: 1 pauses the bulk lane, 2 also expires
    standard requests early, 3 also caps the length of texts.
    """

    enabled: bool = _field(True, "shed load in steps while realtime requests miss their deadlines")
    window_ms: int = _field(10000, "sliding window over which the realtime miss ratio is measured")
    min_samples: int = _field(20, "realtime answers the window needs before it may escalate")
    miss_ratio_high: float = _field(
        0.05, "escalate one level when the window's realtime miss ratio is above this"
    )
    miss_ratio_low: float = _field(
        0.01, "the window is healthy below this miss ratio (de-escalate after hold_ms of it)"
    )
    cooldown_ms: int = _field(5000, "least time between two level changes")
    hold_ms: int = _field(15000, "time the window must stay healthy before each step down")
    standard_deadline_factor: float = _field(
        0.5, "level 2+: a standard request's deadline is shortened to this share of its budget"
    )
    max_text_chars: int = _field(512, "level 3: the longest text computed, in characters")

    def __post_init__(self) -> None:
        problems = []
        if self.window_ms < 1 or self.min_samples < 1:
            problems.append("window_ms and min_samples must be at least 1")
        if not 0.0 < self.miss_ratio_low < self.miss_ratio_high < 1.0:
            problems.append("need 0 < miss_ratio_low < miss_ratio_high < 1")
        if self.cooldown_ms < 0 or self.hold_ms < 0:
            problems.append("cooldown_ms and hold_ms must not be negative")
        if not 0.0 < self.standard_deadline_factor <= 1.0:
            problems.append("standard_deadline_factor must be in (0, 1]")
        if self.max_text_chars < 1:
            problems.append("max_text_chars must be at least 1")
        if problems:
            raise ConfigurationError("PIPELINE_DEGRADE_*: " + "; ".join(problems))


@dataclasses.dataclass(frozen=True)
class BreakerSettings:
    """The model's circuit breaker (``scheduling.breaker``)."""

    enabled: bool = _field(True, "stop calling a model that keeps failing; probe it again later")
    failures_to_open: int = _field(
        5, "consecutive failed model calls (every input failed, or the call raised) that open it"
    )
    open_ms: int = _field(5000, "time open before one probe batch is let through")
    open_ms_max: int = _field(60000, "cap of the open time, which doubles after each failed probe")
    fallback_model_path: str = _field(
        "", "model folder used while open; empty: dead-letter at once (CircuitOpenError)"
    )

    def __post_init__(self) -> None:
        if self.failures_to_open < 1:
            raise ConfigurationError("PIPELINE_BREAKER_FAILURES_TO_OPEN must be at least 1")
        if not 0 < self.open_ms <= self.open_ms_max:
            raise ConfigurationError("PIPELINE_BREAKER_*: need 0 < open_ms <= open_ms_max")


_SECTIONS: dict[str, type[Any]] = {
    "kafka": KafkaSettings,
    "kafka_security": KafkaSecuritySettings,
    "local_kafka": LocalKafkaSettings,
    "topics": TopicSettings,
    "validation": ValidationSettings,
    "model": ModelSettings,
    "batch": BatchSettings,
    "retry": RetrySettings,
    "dedupe": DedupeSettings,
    "worker": WorkerSettings,
    "metrics": MetricsSettings,
    "log": LogSettings,
    "scheduler": SchedulerSettings,
    "degrade": DegradeSettings,
    "breaker": BreakerSettings,
}

T = TypeVar("T")


def _coerce(name: str, raw: str, kind: Any) -> Any:
    if kind is bool:
        low = raw.strip().lower()
        if low in {"1", "true", "yes", "on"}:
            return True
        if low in {"0", "false", "no", "off", ""}:
            return False
        raise ConfigurationError(f"{name}={raw!r}: expected true or false")
    if kind is Secret:
        return Secret(raw)
    if kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            raise ConfigurationError(f"{name}={raw!r}: expected a number") from None
    return raw


def _load(cls: type[T], section: str, env: Mapping[str, str]) -> T:
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        var = f"{PREFIX}{section}_{f.name}".upper()
        if var in env:
            values[f.name] = _coerce(var, env[var], hints[f.name])
    return cls(**values)


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every setting of the pipeline, one frozen section per stage."""

    kafka: KafkaSettings = dataclasses.field(default_factory=KafkaSettings)
    kafka_security: KafkaSecuritySettings = dataclasses.field(
        default_factory=KafkaSecuritySettings
    )
    local_kafka: LocalKafkaSettings = dataclasses.field(default_factory=LocalKafkaSettings)
    topics: TopicSettings = dataclasses.field(default_factory=TopicSettings)
    validation: ValidationSettings = dataclasses.field(default_factory=ValidationSettings)
    model: ModelSettings = dataclasses.field(default_factory=ModelSettings)
    batch: BatchSettings = dataclasses.field(default_factory=BatchSettings)
    retry: RetrySettings = dataclasses.field(default_factory=RetrySettings)
    dedupe: DedupeSettings = dataclasses.field(default_factory=DedupeSettings)
    worker: WorkerSettings = dataclasses.field(default_factory=WorkerSettings)
    metrics: MetricsSettings = dataclasses.field(default_factory=MetricsSettings)
    log: LogSettings = dataclasses.field(default_factory=LogSettings)
    scheduler: SchedulerSettings = dataclasses.field(default_factory=SchedulerSettings)
    degrade: DegradeSettings = dataclasses.field(default_factory=DegradeSettings)
    breaker: BreakerSettings = dataclasses.field(default_factory=BreakerSettings)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read every section from ``env`` (default ``os.environ``); unknown
        ``PIPELINE_*`` variables raise, so a typo never goes unnoticed."""
        env = os.environ if env is None else env
        known = {var for var, *_ in describe()}
        unknown = sorted(k for k in env if k.startswith(PREFIX) and k not in known)
        if unknown:
            raise ConfigurationError(
                f"unknown setting(s) {', '.join(unknown)}; run `pipeline settings` for the list"
            )
        sections = {name: _load(cls_, name, env) for name, cls_ in _SECTIONS.items()}
        return cls(**sections)

    def replace(self, **sections: Any) -> Settings:
        """A copy with whole sections swapped, e.g. ``s.replace(kafka=...)``."""
        return dataclasses.replace(self, **sections)


def describe() -> Iterator[tuple[str, str, str]]:
    """Yield ``(variable, default, help)`` for every setting, in section order."""
    for section, cls in _SECTIONS.items():
        for f in dataclasses.fields(cls):
            yield f"{PREFIX}{section}_{f.name}".upper(), repr(f.default), f.metadata["help"]
