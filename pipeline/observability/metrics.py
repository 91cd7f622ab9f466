"""Every metric the pipeline exports, in one place, so the dashboard and the code agree.

:class:`PipelineMetrics` is the facade the runtime calls; each method records
one event or one reading, and none of them raises for a value it did not
expect (an unknown lane still gets counted, under its own label). Every
family's name starts with :data:`PREFIX`; ``ops/grafana`` and
``ops/prometheus/alerts.yml`` name only families listed in :data:`FAMILIES`
(the catalogue, :mod:`pipeline.observability.metric_families`, re-exported here;
``tests/unit/observability/test_metrics.py`` checks it).

:func:`start_metrics_server` serves ``/metrics`` with prometheus_client's own
HTTP server on a daemon thread (:mod:`pipeline.observability.metrics_server`, re-exported
here). The families recorded for every request are lock-free
(:mod:`pipeline.observability.metrics_local`); a scrape still sees their current values.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from pipeline.errors import STAGES
from pipeline.observability.metric_families import (
    BATCH_LATENCY_BUCKETS,
    BATCH_SIZE_BUCKETS,
    BREAKER_STATES,
    DEDUPE_LEVELS,
    FAMILIES,
    LATENCY_BUCKETS,
    PADDING_BUCKETS,
    PASSED_HOW,
    PREFIX,
    REASONS,
    RECOVERY_ACTIONS,
    REGISTRY_OUTCOMES,
    SERVED,
    STALL_BUCKETS,
    TOKEN_BUCKETS,
)
from pipeline.observability.metrics_local import LocalCounter, LocalFamilies, LocalHistogram
from pipeline.observability.metrics_server import MetricsServer, start_metrics_server
from pipeline.settings import LANES

# A "*_created" timestamp series per counter and histogram doubles the scrape
# for nothing a dashboard reads.
disable_created_metrics()  # type: ignore[no-untyped-call]

__all__ = [
    "BATCH_LATENCY_BUCKETS",
    "FAMILIES",
    "LATENCY_BUCKETS",
    "PREFIX",
    "MetricsServer",
    "PipelineMetrics",
    "start_metrics_server",
]


class PipelineMetrics:
    """The pipeline's metrics in ``registry`` (a fresh one when omitted).

    Known label values (lanes, stages, levels, ...) are created at zero up
    front, so ``rate()`` and alerts see a series before its first event.

    The per-request methods (:meth:`arrived` to :meth:`wait`) take no lock:
    call them from one thread (the worker's event loop calls them all). The
    others, and reading the registry, are safe from any thread.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, process_collectors: bool = True
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        if process_collectors:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
        h = {name: help_ for name, (_kind, help_) in FAMILIES.items()}

        def counter(name: str, labels: Iterable[str] = ()) -> Counter:
            return Counter(name, h[name], list(labels), registry=r)

        def gauge(name: str, labels: Iterable[str] = ()) -> Gauge:
            return Gauge(name, h[name], list(labels), registry=r)

        def histogram(name: str, buckets: Iterable[float], labels: Iterable[str] = ()) -> Histogram:
            return Histogram(name, h[name], list(labels), registry=r, buckets=tuple(buckets))

        # Recorded for every request: lock-free families (see pipeline.observability.metrics_local),
        # written by the event loop alone, read by whoever collects the registry.
        def local(name: str, labels: Iterable[str]) -> LocalCounter:
            return LocalCounter(name, h[name], list(labels))

        def local_histogram(name: str, labels: Iterable[str]) -> LocalHistogram:
            return LocalHistogram(name, h[name], LATENCY_BUCKETS, list(labels))

        self._received = local("pipeline_requests_received", ["lane"])
        self._completed = local("pipeline_requests_completed", ["lane", "served"])
        self._dead = local("pipeline_dead_letters", ["stage", "lane"])
        self._expired = local("pipeline_requests_expired", ["lane"])
        self._missed = local("pipeline_deadline_missed", ["lane"])
        self._dedupe = local("pipeline_dedupe_hits", ["level"])
        self._latency = local_histogram("pipeline_request_latency_seconds", ["lane"])
        self._wait = local_histogram("pipeline_queue_wait_seconds", ["lane"])
        LocalFamilies(
            [self._received, self._completed, self._dead, self._expired, self._missed,
             self._dedupe, self._latency, self._wait],
            r,
        )  # fmt: skip
        self._batches = counter("pipeline_batches", ["reason"])
        self._batch_size = histogram("pipeline_batch_size", BATCH_SIZE_BUCKETS)
        self._batch_tokens = histogram("pipeline_batch_padded_tokens", TOKEN_BUCKETS)
        self._padding = histogram("pipeline_batch_padding_ratio", PADDING_BUCKETS)
        self._batch_latency = histogram("pipeline_batch_latency_seconds", BATCH_LATENCY_BUCKETS)
        self._loop_lag = histogram("pipeline_event_loop_lag_seconds", STALL_BUCKETS)
        self._gc_pause = histogram("pipeline_gc_pause_seconds", STALL_BUCKETS, ["generation"])
        self._real_tokens = counter("pipeline_tokens_real")
        self._padded_tokens = counter("pipeline_tokens_padded")
        self._depth = gauge("pipeline_queue_depth", ["lane"])
        self._inflight = gauge("pipeline_inflight_requests")
        self._oldest = gauge("pipeline_oldest_unreleased_input_seconds")
        self._budget = gauge("pipeline_token_budget")
        self._budget_changes = counter("pipeline_token_budget_changes", ["direction"])
        self._paused, self._passed, self._recovery_stalls = (
            gauge("pipeline_lane_paused", ["lane"]),
            counter("pipeline_lane_offsets_passed", ["how"]),
            counter("pipeline_dedupe_recovery_stalls", ["action"]),
        )
        self._util = gauge("pipeline_device_utilisation_ratio")
        self._mem_used = gauge("pipeline_device_memory_used_bytes")
        self._mem_total = gauge("pipeline_device_memory_total_bytes")
        self._busy = gauge("pipeline_engine_busy_ratio")
        self._forward_s, self._lock_wait_s, self._restarts = (
            counter(f"pipeline_model_{n}")
            for n in ("forward_seconds", "lock_wait_seconds", "process_restarts")
        )
        self._model_seen = (0.0, 0.0, 0)
        self._lag = gauge("pipeline_consumer_lag", ["topic", "partition"])
        self._breaker = gauge("pipeline_breaker_state", ["state"])
        self._shed = gauge("pipeline_shed_level")
        self._registry_waiting = gauge("pipeline_registry_waiting_schemas")
        self._registry_lookups = counter("pipeline_registry_lookups", ["outcome"])
        self._model = Info("pipeline_model", h["pipeline_model"], registry=r)
        self._lock = threading.Lock()  # guards the breaker's one-hot update
        # Labelled children by (family, label values): ``labels()`` costs a few
        # microseconds per call, paid several times for every event otherwise.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

        self._create_known_children()

    def _create_known_children(self) -> None:
        """Every known label value at zero, so a series exists before its first event."""
        for lane in LANES:
            for family in (self._received, self._expired, self._missed):
                family.touch((lane,))
            for served in SERVED:
                self._completed.touch((lane, served))
            for stage in STAGES:
                self._dead.touch((stage, lane))
            self._latency.touch((lane,))
            self._wait.touch((lane,))
            self._depth.labels(lane=lane).set(0)
            self._paused.labels(lane=lane).set(0)
        for level in DEDUPE_LEVELS:
            self._dedupe.touch((level,))
        for reason in REASONS:
            self._batches.labels(reason=reason)
        for direction, how in zip(("grow", "shrink"), PASSED_HOW, strict=True):
            self._budget_changes.labels(direction=direction)
            self._passed.labels(how=how)
        for generation in ("0", "1", "2"):
            self._gc_pause.labels(generation=generation)
        for action in RECOVERY_ACTIONS:
            self._recovery_stalls.labels(action=action)
        for outcome in REGISTRY_OUTCOMES:
            self._registry_lookups.labels(outcome=outcome)

    def _child(self, family: Any, *values: str) -> Any:
        """``family.labels(*values)``, looked up once per label set."""
        key = (id(family), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(*values)
        return child

    # -- requests ---------------------------------------------------------

    def arrived(self, lane: str) -> None:
        """One record consumed from ``lane``'s topic (valid or not)."""
        self._received.inc((lane,))

    def completed(
        self, lane: str, served: str, latency_s: float | None = None, *, late: bool = False
    ) -> None:
        """One result published (acknowledged by the broker).

        ``served`` is the result's ``served`` field; a value other than
        ``computed`` also counts as a dedupe hit at that level. ``latency_s``
        is the request's age at publication (created to completed);
        ``late`` says it missed its deadline (counted by :meth:`deadline_missed`).
        """
        self._completed.inc((lane, served))
        if served != "computed":
            self._dedupe.inc((served,))
        if latency_s is not None:
            # max(0.0, x) without its builtin call; NaN becomes 0.0 as there.
            self._latency.observe((lane,), latency_s if latency_s > 0.0 else 0.0)
        if late:
            self.deadline_missed(lane)

    def dead_letter(self, stage: str, lane: str) -> None:
        """One dead letter published; stage ``expired`` also counts as expired."""
        self._dead.inc((stage, lane))
        if stage == "expired":
            self._expired.inc((lane,))

    def expired(self, lane: str) -> None:
        """A request dropped because its deadline passed, when not counted by
        :meth:`dead_letter` (``stage="expired"`` counts it already)."""
        self._expired.inc((lane,))

    def deadline_missed(self, lane: str) -> None:
        """A result published after its request's deadline (lanes that run late)."""
        self._missed.inc((lane,))

    def wait(self, lane: str, seconds: float) -> None:
        """How long one request waited between arrival and its batch's dispatch."""
        self._wait.observe((lane,), seconds if seconds > 0.0 else 0.0)

    # -- batches ----------------------------------------------------------

    def batch(
        self,
        size: int,
        real_tokens: int,
        padded_tokens: int,
        latency_s: float,
        reason: str = "window",
    ) -> None:
        """One model batch finished: its requests, tokens, run time and why it was sent."""
        self._child(self._batches, reason).inc()
        self._batch_size.observe(size)
        self._batch_latency.observe(max(0.0, latency_s))
        if padded_tokens > 0:
            self._batch_tokens.observe(padded_tokens)
            self._padding.observe(max(0.0, 1.0 - real_tokens / padded_tokens))
            self._padded_tokens.inc(padded_tokens)
        if real_tokens > 0:
            self._real_tokens.inc(real_tokens)

    # -- gauges -----------------------------------------------------------

    def loop_lag(self, seconds: float) -> None:
        self._loop_lag.observe(max(0.0, seconds))

    def gc_pause(self, generation: int, seconds: float) -> None:
        self._child(self._gc_pause, str(generation)).observe(max(0.0, seconds))

    def queue_depth(self, lane: str, n: int) -> None:
        self._depth.labels(lane=lane).set(n)

    def inflight(self, n: int) -> None:
        self._inflight.set(n)

    def oldest_unreleased(self, seconds: float) -> None:
        self._oldest.set(max(0.0, seconds))

    def budget(self, tokens: int) -> None:
        self._budget.set(tokens)

    def budget_change(self, direction: str) -> None:
        """The controller moved the budget: ``grow`` or ``shrink``."""
        self._budget_changes.labels(direction=direction).inc()

    def paused(self, lane: str, is_paused: bool) -> None:
        self._paused.labels(lane=lane).set(1 if is_paused else 0)

    def device(self, utilisation: float, memory_used: int, memory_total: int) -> None:
        """One GPU reading; ``utilisation`` is 0..1 (a percentage above 1 is scaled)."""
        self._util.set(utilisation / 100.0 if utilisation > 1.0 else utilisation)
        self._mem_used.set(memory_used)
        self._mem_total.set(memory_total)

    def busy_fraction(self, f: float) -> None:
        """The engine thread's busy share (``InferenceEngine.busy_fraction()``)."""
        self._busy.set(f)

    def model_timing(self, forward_s: float, lock_wait_s: float | None, restarts: int) -> None:
        """The model side's running totals (``ForwardTiming.totals``, the model
        process's restarts); the counters advance by what is new since the last call."""
        seen_f, seen_w, seen_r = self._model_seen
        wait = lock_wait_s or 0.0
        self._forward_s.inc(max(0.0, forward_s - seen_f))
        self._lock_wait_s.inc(max(0.0, wait - seen_w))
        self._restarts.inc(max(0, restarts - seen_r))
        self._model_seen = (max(seen_f, forward_s), max(seen_w, wait), max(seen_r, restarts))

    def consumer_lag(self, topic: str, partition: int, lag: int) -> None:
        self._lag.labels(topic=topic, partition=str(partition)).set(max(0, lag))

    def offsets_passed(self, count: int, explained: bool) -> None:
        """``count`` lane offsets that hold no record were passed (see the family)."""
        self._passed.labels(how=PASSED_HOW[0] if explained else PASSED_HOW[1]).inc(count)

    def recovery_stall(self, action: str, count: int = 1) -> None:
        """The watch on the stored results' recovery acted ``count`` times (see the family)."""
        self._recovery_stalls.labels(action=action).inc(count)

    def forget_partition(self, topic: str, partition: int) -> None:
        """Drop a revoked partition's lag series (another worker reports it now)."""
        with contextlib.suppress(KeyError):
            self._lag.remove(topic, str(partition))

    def breaker_state(self, state: str) -> None:
        """The circuit breaker is now in ``state`` (closed, open or half_open)."""
        with self._lock:
            for known in {*BREAKER_STATES, state}:
                self._breaker.labels(state=known).set(1 if known == state else 0)

    def shed_level(self, level: int) -> None:
        """Load shedding is now at ``level`` (0 normal .. 3, see scheduling/degrade.py)."""
        self._shed.set(level)

    def registry_lookup(self, outcome: str) -> None:
        """One writer-schema lookup ended: ``found``, ``unknown`` or ``unavailable``."""
        self._registry_lookups.labels(outcome=outcome).inc()

    def registry_waiting(self, schema_ids: int) -> None:
        """How many schema ids' records wait for a registry that does not answer."""
        self._registry_waiting.set(schema_ids)

    def model(self, name: str, version: str, device: str, task: str) -> None:
        """What this worker serves, as labels of ``pipeline_model_info``."""
        self._model.info({"name": name, "version": version, "device": device, "task": task})

    # -- reading ----------------------------------------------------------

    def value(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """One sample's current value, e.g. ``value("pipeline_dead_letters_total",
        {"stage": "infer", "lane": "bulk"})``; ``None`` when absent."""
        result = self.registry.get_sample_value(name, dict(labels or {}))
        return None if result is None else float(result)
