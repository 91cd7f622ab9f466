"""pipeline.observability.metrics_local: the lock-free per-request families export exactly what
prometheus_client's own Counter and Histogram export for the same calls."""

from __future__ import annotations

import math
import random
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import Protocol

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from pipeline.errors import STAGES
from pipeline.observability.metric_families import DEDUPE_LEVELS, FAMILIES, LATENCY_BUCKETS, SERVED
from pipeline.observability.metrics import PipelineMetrics as Metrics
from pipeline.observability.metrics_local import LocalCounter, LocalFamilies, LocalHistogram
from pipeline.settings import LANES

PER_REQUEST = (
    "pipeline_requests_received",
    "pipeline_requests_completed",
    "pipeline_dead_letters",
    "pipeline_requests_expired",
    "pipeline_deadline_missed",
    "pipeline_dedupe_hits",
    "pipeline_request_latency_seconds",
    "pipeline_queue_wait_seconds",
)


class Recorder(Protocol):
    def arrived(self, lane: str) -> None: ...
    def completed(
        self, lane: str, served: str, latency_s: float | None = None, *, late: bool = False
    ) -> None: ...
    def dead_letter(self, stage: str, lane: str) -> None: ...
    def expired(self, lane: str) -> None: ...
    def deadline_missed(self, lane: str) -> None: ...
    def wait(self, lane: str, seconds: float) -> None: ...


class Plain:
    """The per-request methods as PipelineMetrics recorded them with prometheus_client's
    own Counter and Histogram, known label values created up front in the same order."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        h = {name: help_ for name, (_kind, help_) in FAMILIES.items()}

        def counter(name: str, *labels: str) -> Counter:
            return Counter(name, h[name], labels, registry=r)

        def histogram(name: str) -> Histogram:
            return Histogram(name, h[name], ["lane"], registry=r, buckets=LATENCY_BUCKETS)

        self._received = counter("pipeline_requests_received", "lane")
        self._completed = counter("pipeline_requests_completed", "lane", "served")
        self._dead = counter("pipeline_dead_letters", "stage", "lane")
        self._expired = counter("pipeline_requests_expired", "lane")
        self._missed = counter("pipeline_deadline_missed", "lane")
        self._dedupe = counter("pipeline_dedupe_hits", "level")
        self._latency = histogram("pipeline_request_latency_seconds")
        self._wait = histogram("pipeline_queue_wait_seconds")
        for lane in LANES:
            for family in (self._received, self._expired, self._missed):
                family.labels(lane)
            for served in SERVED:
                self._completed.labels(lane, served)
            for stage in STAGES:
                self._dead.labels(stage, lane)
            self._latency.labels(lane)
            self._wait.labels(lane)
        for level in DEDUPE_LEVELS:
            self._dedupe.labels(level)

    def arrived(self, lane: str) -> None:
        self._received.labels(lane).inc()

    def completed(
        self, lane: str, served: str, latency_s: float | None = None, *, late: bool = False
    ) -> None:
        self._completed.labels(lane, served).inc()
        if served != "computed":
            self._dedupe.labels(served).inc()
        if latency_s is not None:
            self._latency.labels(lane).observe(max(0.0, latency_s))
        if late:
            self.deadline_missed(lane)

    def dead_letter(self, stage: str, lane: str) -> None:
        self._dead.labels(stage, lane).inc()
        if stage == "expired":
            self._expired.labels(lane).inc()

    def expired(self, lane: str) -> None:
        self._expired.labels(lane).inc()

    def deadline_missed(self, lane: str) -> None:
        self._missed.labels(lane).inc()

    def wait(self, lane: str, seconds: float) -> None:
        self._wait.labels(lane).observe(max(0.0, seconds))


# Bucket edges exactly, just either side of them, nothing, clamped and unbounded values.
EDGES = [
    *LATENCY_BUCKETS,
    *(math.nextafter(b, math.inf) for b in LATENCY_BUCKETS),
    *(math.nextafter(b, 0.0) for b in LATENCY_BUCKETS),
    0.0, -0.0, -1.0, 1e-9, 1e9, math.inf, -math.inf, math.nan,
]  # fmt: skip


def play(target: Recorder, seed: int, n: int = 3000) -> None:
    """The same sequence of calls, with lanes, levels and stages known and unknown."""
    rng = random.Random(seed)
    lanes = [*LANES, "a lane nobody configured"]
    served_values = [*SERVED, "cache"]
    for value in EDGES:
        target.completed("realtime", "computed", value)
        target.wait("bulk", value)
    for _ in range(n):
        lane = rng.choice(lanes)
        target.arrived(lane)
        roll = rng.random()
        if roll < 0.6:
            target.wait(lane, rng.expovariate(20.0))
            target.completed(lane, "computed", rng.expovariate(5.0), late=rng.random() < 0.1)
        elif roll < 0.85:
            target.completed(lane, rng.choice(served_values), rng.choice([None, rng.random()]))
        elif roll < 0.95:
            target.dead_letter(rng.choice([*STAGES, "unknown"]), lane)
        else:
            target.expired(lane)
            target.deadline_missed(lane)


class _Only:
    def __init__(self, registry: CollectorRegistry, names: Iterable[str]) -> None:
        self._registry, self._names = registry, set(names)

    def collect(self) -> Iterator[Metric]:
        return (f for f in self._registry.collect() if f.name in self._names)


def text(registry: CollectorRegistry) -> str:
    """The per-request families of ``registry`` as ``/metrics`` serves them, in order."""
    return generate_latest(_Only(registry, PER_REQUEST)).decode()


def test_a_fresh_facade_exposes_what_prometheus_client_would() -> None:
    assert text(Metrics(process_collectors=False).registry) == text(Plain().registry)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_same_calls_give_the_same_text_exposition(seed: int) -> None:
    ours, plain = Metrics(process_collectors=False), Plain()
    play(ours, seed)
    play(plain, seed)
    expected = text(plain.registry)
    assert text(ours.registry) == expected
    # Read without any flush, twice: collecting changes nothing.
    assert text(ours.registry) == expected
    assert 'le="+Inf"' in expected and 'lane="a lane nobody configured"' in expected


def test_the_families_keep_their_place_in_the_exposition() -> None:
    """In the registry's order the per-request families come first, in FAMILIES' order,
    before the per-batch ones, as when they were prometheus_client's own."""
    names = [f.name for f in Metrics(process_collectors=False).registry.collect()]
    assert names[: len(PER_REQUEST)] == list(PER_REQUEST) == list(FAMILIES)[: len(PER_REQUEST)]


def test_readers_see_current_values_without_a_flush() -> None:
    m = Metrics(process_collectors=False)
    for i in range(1, 4):
        m.arrived("bulk")
        m.wait("bulk", 0.2)
        assert m.value("pipeline_requests_received_total", {"lane": "bulk"}) == i
        assert m.value("pipeline_queue_wait_seconds_bucket", {"lane": "bulk", "le": "0.2"}) == i
        assert m.value("pipeline_queue_wait_seconds_count", {"lane": "bulk"}) == i
        assert m.value("pipeline_queue_wait_seconds_sum", {"lane": "bulk"}) == pytest.approx(
            0.2 * i
        )


def test_the_names_are_registered_for_duplicates_and_name_filters() -> None:
    m = Metrics(process_collectors=False)
    with pytest.raises(ValueError, match="Duplicated"):
        Counter("pipeline_requests_received", "again", registry=m.registry)
    m.arrived("realtime")
    # /metrics?name[]=... collects only the collectors that describe the name.
    only = m.registry.restricted_registry(["pipeline_requests_received_total"])
    assert 'pipeline_requests_received_total{lane="realtime"} 1.0' in generate_latest(only).decode()


def test_unsorted_buckets_are_refused_and_inf_is_added() -> None:
    with pytest.raises(ValueError, match="sorted"):
        LocalHistogram("h", "help", [1.0, 0.5])
    r = CollectorRegistry()
    hist = LocalHistogram("h", "help", [1.0])
    LocalFamilies([hist, LocalCounter("c", "help")], r)
    hist.observe((), 5.0)
    assert r.get_sample_value("h_bucket", {"le": "+Inf"}) == 1
    assert r.get_sample_value("h_bucket", {"le": "1.0"}) == 0
    assert r.get_sample_value("c_total") is None  # no child until touched or counted


def test_a_scrape_from_another_thread_while_the_loop_records() -> None:
    """The loop writes, new label values included, while another thread collects: no
    collect fails, counts never go back, and the last one is exact."""
    m = Metrics(process_collectors=False)
    errors: list[BaseException] = []
    seen: list[float] = []
    stop = threading.Event()

    def scrape() -> None:
        try:
            while not stop.is_set():
                generate_latest(m.registry)
                seen.append(m.value("pipeline_requests_received_total", {"lane": "bulk"}) or 0.0)
        except BaseException as exc:  # reported below
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over as often as it goes
    reader = threading.Thread(target=scrape)
    reader.start()
    try:
        for i in range(20_000):
            m.arrived("bulk")
            m.completed(f"lane-{i % 3000}", f"served-{i}", 0.01)  # new children throughout
            m.wait(f"lane-{i // 20}", 0.01)
    finally:
        stop.set()
        reader.join()
        sys.setswitchinterval(interval)
    assert not errors, errors
    assert seen == sorted(seen)
    assert m.value("pipeline_requests_received_total", {"lane": "bulk"}) == 20_000
    assert m.value("pipeline_queue_wait_seconds_count", {"lane": "lane-999"}) == 20
    assert m.value("pipeline_request_latency_seconds_count", {"lane": "lane-1"}) == 7
