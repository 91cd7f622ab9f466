"""Settings of the serving stages: validation, model, bounds, retries, dedupe, worker,
metrics and logs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pipeline.errors import ConfigurationError
from pipeline.settings._fields import _default_cache, _field
from pipeline.settings.lanes import LANES
from pipeline.settings.tasks import TASK_NAMED, TASKS
from pipeline.settings.tasks import help_text as task_help


@dataclasses.dataclass(frozen=True)
class ValidationSettings:
    """Size caps on input; what breaks them is dead-lettered (stage ``validate``)."""

    max_payload_bytes: int = _field(65536, "largest request value accepted, in bytes")
    max_text_chars: int = _field(8192, "longest text accepted, in characters")


#: How the engine pads a batch (``ModelSettings.padding``).
PADDINGS: tuple[str, ...] = ("auto", "longest", "bucket", "shape")

#: Whether the network runs as a TorchScript trace (``ModelSettings.trace``).
TRACES: tuple[str, ...] = ("auto", "on", "off")

#: Whether the network runs in a process of its own (``ModelSettings.process``).
PROCESSES: tuple[str, ...] = ("auto", "on", "off")

#: The weights' dtype (``ModelSettings.dtype``).
DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")

#: What a simulated device costs the host (``pipeline.inference.sim.PROFILES``).
SIM_PROFILES: tuple[str, ...] = ("eager", "traced", "graphed", "slow")


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """Which model runs, where, and how."""

    path: str = _field("", "Hugging Face model folder; empty means the bundled all-MiniLM-L6-v2")
    name: str = _field("", "model name reported in results; empty means derived from the path")
    version: str = _field("1", "model version; stored results of another version are ignored")
    task: str = _field(TASKS[0], task_help())
    device: str = _field(
        "auto",
        "auto, cpu, cuda, or sim: a simulated accelerator (the real tokenizer and padding, "
        "the network replaced by what a GPU costs the host; a benchmark instrument whose "
        "embeddings are meaningless, see docs/design.md)",
    )
    dtype: str = _field(
        "auto",
        "weights' dtype: float32, bfloat16, float16; auto: bfloat16 on a CUDA device that "
        "supports it (else float16), float32 on a CPU. Part of the stored results' key",
    )
    process: str = _field(
        "auto",
        "on: the network and its tokenizer run in a process of its own (its interpreter "
        "lock is the model's alone, and the worker never imports torch); off: on the "
        "worker's inference thread; auto: on for every model (the noop task has none)",
    )
    process_timeout_s: float = _field(
        60.0,
        "longest one call into the model process may take before the process is "
        "deemed hung, killed and restarted (the batch fails into the retry path)",
    )
    process_restarts: int = _field(
        5,
        "restarts of a dead model process allowed within 10 minutes; past them a batch "
        "fails at once (the circuit breaker opens) until the window has room again",
    )
    sim_profile: str = _field(
        "eager",
        "device=sim: what a forward costs the host: eager (~250 lock round trips), traced "
        "(1), graphed (~10), slow (a device slower than the pipeline); see docs/design.md",
    )
    sim_file: str = _field(
        "",
        "device=sim: the file that makes every process on the host share one simulated "
        "device (a lock and a busy-time counter); empty: ~/.cache/pipeline/sim-device",
    )
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
    trace: str = _field(
        "auto",
        "on: run the network as a TorchScript trace, which holds no GIL between its ops, so "
        "a busy event loop cannot stall a batch (eager modules wait for the GIL at every op); "
        "off: eager; auto: on for a CPU (checked against eager at start-up, eager if unequal)",
    )
    fail_on: str = _field(
        "", "testing aid: a regex; texts matching it make the model raise (fault injection)"
    )

    def __post_init__(self) -> None:
        problems = []
        if self.padding not in PADDINGS:
            problems.append(f"PADDING={self.padding!r}: expected one of {', '.join(PADDINGS)}")
        if self.trace not in TRACES:
            problems.append(f"TRACE={self.trace!r}: expected one of {', '.join(TRACES)}")
        if self.process not in PROCESSES:
            problems.append(f"PROCESS={self.process!r}: expected one of {', '.join(PROCESSES)}")
        if self.dtype not in DTYPES:
            problems.append(f"DTYPE={self.dtype!r}: expected one of {', '.join(DTYPES)}")
        if self.sim_profile not in SIM_PROFILES:
            problems.append(
                f"SIM_PROFILE={self.sim_profile!r}: expected one of {', '.join(SIM_PROFILES)}"
            )
        if self.process_timeout_s <= 0:
            problems.append(f"PROCESS_TIMEOUT_S={self.process_timeout_s}: must be > 0")
        if self.process_restarts < 0:
            problems.append(f"PROCESS_RESTARTS={self.process_restarts}: must be >= 0")
        for name in ("torch_threads", "torch_interop_threads", "tokenizer_threads"):
            if getattr(self, name) < 0:
                problems.append(f"{name.upper()}={getattr(self, name)}: must be >= 0")
        if problems:
            raise ConfigurationError("PIPELINE_MODEL_" + "; PIPELINE_MODEL_".join(problems))

    @property
    def sim_path(self) -> Path:
        """The simulated device's shared file (``sim_file``, else the default)."""
        return Path(self.sim_file or "~/.cache/pipeline/sim-device").expanduser()

    @property
    def display_name(self) -> str:
        """The model's name in results: ``name``, else the folder's name."""
        if self.name:
            return self.name
        task = TASK_NAMED.get(self.task)
        if task is not None and not task.runs_model:  # shares no stored results with a model
            return task.name
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
    max_inflight_bytes: int = _field(
        64 * 2**20,
        "per lane: most bytes of record values accepted but not yet acknowledged (then intake "
        "waits); one record always fits into an empty lane",
    )
    stream_buffer: int = _field(
        1024,
        "per lane: fetched records buffered ahead of intake (with at most "
        "`PIPELINE_BATCH_MAX_INFLIGHT_BYTES` bytes); a full lane's partitions are not fetched "
        "until it is down to half",
    )


@dataclasses.dataclass(frozen=True)
class RetrySettings:
    """Bounded retries with exponential backoff and full jitter."""

    max_attempts: int = _field(3, "tries of a failing input before it is dead-lettered")
    backoff_base_ms: int = _field(50, "first backoff, doubled per attempt")
    backoff_max_ms: int = _field(2000, "largest backoff")


#: The least RocksDB memory a partition of stored results may have
#: (``DedupeSettings.store_memory_mib``): 1 MiB memtables, a 2 MiB cache.
MIN_STORE_MEMORY_MIB = 4


@dataclasses.dataclass(frozen=True)
class DedupeSettings:
    """The stored-result level of dedupe (RocksDB table)."""

    ttl_s: int = _field(
        7 * 24 * 3600,
        "seconds a stored result stays valid, and about how long it stays on disk: the "
        "store keeps about 1.7 KB per new text for this long (the README's bounds)",
    )
    enabled: bool = _field(True, "serve repeated texts from stored results")
    store_memory_mib: int = _field(
        32,
        "RocksDB memory of the stored results per partition, in MiB: two memtables of a "
        "quarter each and a block cache of half; a worker holds this times its partitions",
    )
    store_wal: bool = _field(
        False,
        "write RocksDB's write-ahead log for stored results; off: the changelog topic is "
        "the durable copy, and a crash replays up to two memtables more of it",
    )
    recovery_stall_s: float = _field(
        10.0,
        "seconds a partition of the stored results' recovery may receive nothing before "
        "it is read again; after two such readings it is let go (its results are computed "
        "again): the recovery holds the partition's lanes meanwhile",
    )

    def __post_init__(self) -> None:
        if not self.recovery_stall_s > 0:
            raise ConfigurationError(
                f"PIPELINE_DEDUPE_RECOVERY_STALL_S={self.recovery_stall_s}: expected a number "
                "of seconds above 0"
            )
        if self.store_memory_mib < MIN_STORE_MEMORY_MIB:
            raise ConfigurationError(
                f"PIPELINE_DEDUPE_STORE_MEMORY_MIB={self.store_memory_mib}: expected at least "
                f"{MIN_STORE_MEMORY_MIB} (MiB per partition: two memtables of a quarter each "
                "and a block cache of half)"
            )


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
    lanes: str = _field(
        ",".join(LANES),
        "comma-separated lanes whose topics this worker consumes: realtime for a realtime "
        "fleet, standard,bulk for a batch fleet beside it. Each fleet needs its own "
        "PIPELINE_WORKER_APP_ID (its consumer group, and its own dedupe table), and every "
        "lane exactly one fleet, or its requests are answered twice or never",
    )
    expire_lanes: str = _field(
        "realtime",
        "comma-separated lanes whose requests are dead-lettered (stage expired) instead of "
        "computed once their deadline has passed; other lanes run late",
    )
    log_payloads: bool = _field(False, "include request text in logs (off: never log payloads)")
    producer_linger_ms: int = _field(
        5, "results and dead letters wait up to this long to share one produce request"
    )
    answer_timeout_ms: int = _field(
        120_000,
        "how long a result or dead letter may take to be acknowledged, retries included "
        "(librdkafka's message.timeout.ms); past it its fate is unknown and the worker "
        "stops, the input uncommitted",
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
        if self.answer_timeout_ms < 1000:
            raise ConfigurationError("PIPELINE_WORKER_ANSWER_TIMEOUT_MS must be at least 1000")
        named = [x.strip() for x in self.lanes.split(",") if x.strip()]
        unknown = [x for x in named if x not in LANES]
        if unknown or not named or len(set(named)) != len(named):
            raise ConfigurationError(
                f"PIPELINE_WORKER_LANES={self.lanes!r}: expected one or more of "
                f"{', '.join(LANES)}, comma-separated, each once"
            )

    def consumed_lanes(self) -> tuple[str, ...]:
        """The lanes whose topics this worker consumes, highest first."""
        named = {x.strip() for x in self.lanes.split(",")}
        return tuple(lane for lane in LANES if lane in named)

    def lane_deadline_ms(self, lane: str) -> int:
        return int(getattr(self, f"lane_deadline_ms_{lane}"))

    def expires(self, lane: str) -> bool:
        """Whether a late request of ``lane`` is expired rather than computed."""
        return lane in {x.strip() for x in self.expire_lanes.split(",")}


@dataclasses.dataclass(frozen=True)
class MetricsSettings:
    """The worker's Prometheus endpoint (``pipeline.observability.metrics``)."""

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
    """How the worker logs (``pipeline.observability.logs``); payload text never appears unless
    ``PIPELINE_WORKER_LOG_PAYLOADS`` is on."""

    format: str = _field("text", "text (human) or json (one object per line, for collectors)")
    level: str = _field("", "root log level (DEBUG, INFO, ...); empty keeps the worker's -l")

    def __post_init__(self) -> None:
        if self.format not in {"text", "json"}:
            raise ConfigurationError(f"PIPELINE_LOG_FORMAT={self.format!r}: expected text or json")
        if self.level and self.level.upper() not in _LOG_LEVELS:
            raise ConfigurationError(f"PIPELINE_LOG_LEVEL={self.level!r}: not a log level")
