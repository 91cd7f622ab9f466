"""Settings of the scheduler, load shedding and the circuit breaker."""

from __future__ import annotations

import dataclasses

from pipeline.errors import ConfigurationError
from pipeline.settings._fields import _field

#: ``max_items`` when 0 (auto): rows a batch may hold on an accelerator, and on a CPU.
ACCELERATOR_MAX_ITEMS = 256
CPU_MAX_ITEMS = 32


@dataclasses.dataclass(frozen=True)
class SchedulerSettings:
    """The adaptive micro-batch scheduler and its batch-size controller.

    Defaults follow docs/design.md's CPU measurements: 8-16 short texts (about 32
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
    max_items: int = _field(
        0,
        "most requests in one batch; 0: auto, 256 on an accelerator (cuda, sim: a GPU's "
        "cost is nearly flat in rows) and 32 on a CPU (past ~16 short texts it gains nothing)",
    )
    window_ms: int = _field(10, "longest wait for a batch to fill once its oldest request arrived")
    margin_ms: int = _field(5, "safety margin kept between a batch's predicted end and a deadline")
    wake_hold_ms: int = _field(
        20,
        "after a request reaches an empty scheduler, a full batch waits this long from then "
        "(realtime in it too; deadlines still dispatch it), so a burst's realtime, fetched "
        "behind its first requests, runs first and is laid out with all of it",
    )
    max_wait_ms_standard: int = _field(
        1000, "a standard request waits at most this long for higher lanes (aging)"
    )
    max_wait_ms_bulk: int = _field(
        5000, "a bulk request waits at most this long for higher lanes (aging)"
    )
    queue_size: int = _field(
        0,
        "bound of each lane's queue; a full lane's topic is paused; 0: auto, "
        "max(512, 4 x max_items), so a queue holds several of the largest batches",
    )
    resume_fraction: float = _field(
        0.5, "a paused lane resumes once its queue is down to this fraction of queue_size"
    )
    # 32 buckets: one token apart up to 16, then steps of at most an eighth of the length
    # up to 64 and a fifth beyond. A batch pads to its bucket on a GPU and the simulated
    # device (to its longest text on a CPU), and the bench's texts are short (median 11
    # tokens), where the old 4-token steps (8,12,16,20,24,32,...) padded a sixth of a
    # text. With exact lengths (codecs.lengths), replayed at the slow simulated device's
    # cost: padding 0.16 -> 0.09, 0.90x -> 0.99x the model alone (docs/design.md,
    # "Exact lengths"). Before that, 13 buckets, not 5 (16..256 by doubling): padding at
    # 0 % duplicates 0.28-0.30 -> 0.18-0.20 on a CPU, throughput +7..25 %.
    seq_buckets: str = _field(
        "4,5,6,7,8,9,10,11,12,13,14,15,16,18,20,22,24,28,32,36,40,48,56,64,80,96,112,128,"
        "160,192,224,256",
        "sequence-length buckets (tokens), ascending; batches pad to one",
    )
    policy: str = _field(
        "seed", "batch-size policy: seed (x0.8 / x1.2), aimd, or fixed (the budget never moves)"
    )
    latency_threshold: float = _field(
        0.5, "a batch is slow when it takes longer than this fraction of the realtime deadline"
    )
    flow_threshold: float = _field(
        0.2,
        "while realtime requests flow (one arrived in the last second), no batch is planned "
        "longer than this fraction of the realtime deadline (latency_threshold otherwise)",
    )
    slow_batches: int = _field(3, "seed policy: consecutive slow batches before the budget shrinks")
    recover_batches: int = _field(
        20,
        "saturated batches in a row, none slow, after which a budget shrunk below token_budget "
        "grows back towards it whatever the utilisation",
    )
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
        "on a GPU, the next batch is formed when the running one is predicted to end within this "
        "plus the engine's measured tokenisation time (so it is tokenised meanwhile), plus what "
        "the device was measured to wait for such batches (at most 50 ms more); < 0: after "
        "it ended. On a CPU batches run one at a time",
    )
    triage: str = _field(
        "auto",
        "on: when more realtime is pending than one capped batch holds, lay it out batch by "
        "batch: batches as large as their earliest deadline allows, and what none finishes in "
        "time expired at once; off: the capped batches, and expiry only once a request would "
        "miss in the batch that would run now; auto: on for a CPU, off on an accelerator (cuda, "
        "sim), where it expired far more realtime under load (README, Scheduling)",
    )

    def __post_init__(self) -> None:
        problems = []
        if not 0.0 <= self.realtime_share < 1.0:
            problems.append("realtime_share must be in [0, 1)")
        if not 1 <= self.token_budget_min <= self.token_budget <= self.token_budget_max:
            problems.append("need 1 <= token_budget_min <= token_budget <= token_budget_max")
        if self.wake_hold_ms < 0:
            problems.append("wake_hold_ms must be at least 0")
        if min(self.slow_batches, self.recover_batches) < 1:
            problems.append("slow_batches and recover_batches must be at least 1")
        if min(self.max_items, self.queue_size) < 0:
            problems.append("max_items and queue_size must be at least 0 (0: auto)")
        if self.triage in ("true", "false"):  # the setting was a boolean once
            object.__setattr__(self, "triage", "on" if self.triage == "true" else "off")
        if self.triage not in ("auto", "on", "off"):
            problems.append(f"triage {self.triage!r}: expected auto, on or off")
        if not 0.0 <= self.resume_fraction < 1.0:
            problems.append("resume_fraction must be in [0, 1)")
        if self.policy not in {"seed", "aimd", "fixed"}:
            problems.append(f"policy {self.policy!r}: expected seed, aimd or fixed")
        if not (0 < self.shrink_factor < 1 and self.grow_factor > 1 and 0 < self.aimd_decrease < 1):
            problems.append("need 0 < shrink_factor, aimd_decrease < 1 < grow_factor")
        if min(self.latency_threshold, self.flow_threshold) <= 0:
            problems.append("latency_threshold and flow_threshold must be positive")
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

    def for_device(self, accelerated: bool) -> SchedulerSettings:
        """These settings with ``max_items``, ``queue_size`` and ``triage`` resolved: as
        set, or when auto :data:`ACCELERATOR_MAX_ITEMS` rows on an accelerator and
        :data:`CPU_MAX_ITEMS` on a CPU, a queue of max(512, 4 x max_items), and the
        triage on for a CPU only."""
        items = self.max_items or (ACCELERATOR_MAX_ITEMS if accelerated else CPU_MAX_ITEMS)
        queue = self.queue_size or max(512, 4 * items)
        triage = self.triage if self.triage != "auto" else ("off" if accelerated else "on")
        if (items, queue, triage) == (self.max_items, self.queue_size, self.triage):
            return self
        return dataclasses.replace(self, max_items=items, queue_size=queue, triage=triage)

    @property
    def buckets(self) -> tuple[int, ...]:
        """``seq_buckets`` parsed: ascending sequence lengths in tokens."""
        return tuple(int(x) for x in self.seq_buckets.split(",") if x.strip())

    def max_wait_ms(self, lane: str) -> int | None:
        """How long a request of ``lane`` may wait for higher lanes (``None``: top lane)."""
        value = getattr(self, f"max_wait_ms_{lane}", None)
        return None if value is None else int(value)


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
