"""A real run for the dashboard picture: a worker, a Prometheus scraping it, traffic.

:func:`record` starts a real worker process (``faust -A pipeline.app worker``,
its own topics, app id, data folder and metrics port, load shedding on) on the
broker at ``bootstrap``, a :class:`~pipeline.observability.dashboard.prometheus.LocalPrometheus`
scraping its ``/metrics`` every second, then plays a :class:`Scenario`:

1. ``healthy``: open-loop Poisson traffic at ``rate`` requests/s, mixed lanes
   (``realtime_share`` of it realtime);
2. ``overload``: ``burst`` standard and bulk requests at once, and the
   stream at ``overload_rate`` (queues fill, lanes pause, realtime misses its
   deadline, load is shed);
3. ``recovery``: the mixed stream alone, until the backlog is gone.

It waits for every request's answer (result or dead letter; at most
``answer_timeout_s``; the curves name that span "no new traffic"), keeps
scraping ``tail_s`` more, then reads the panels' curves through
``query_range`` and stops what it started. The traffic is the
benchmark's seeded workload (``pipeline.tools.bench.workload``), sent and collected
with the benchmark's tools, so the same scenario gives the same requests.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.kafka.client import RequestProducer
from pipeline.observability.dashboard.panels import Panel, grafana_rate_interval
from pipeline.observability.dashboard.prometheus import LocalPrometheus
from pipeline.observability.dashboard.series import Curves, fetch
from pipeline.tools.bench.drive import send
from pipeline.tools.bench.modes import Deployment
from pipeline.tools.bench.workload import BenchRequest, WorkloadSpec, generate

__all__ = ["Recording", "Scenario", "record"]


@dataclass(frozen=True)
class Scenario:
    """What :func:`record` plays (``pipeline dashboard record``'s flags map one to one)."""

    healthy_s: float = 40.0
    overload_s: float = 40.0
    recovery_s: float = 60.0
    rate: float = 4.0
    overload_rate: float = 12.0
    burst: int = 800
    realtime_share: float = 0.25  # of the stream; the rest is 60 % standard, 40 % bulk
    dup_rate: float = 0.2
    seed: int = 7
    queue_size: int = 128
    tail_s: float = 10.0
    answer_timeout_s: float = 300.0

    def phases(self) -> list[tuple[float, float, str]]:
        """(start s, end s, name) of the three phases, seconds since the traffic began."""
        a = self.healthy_s
        b = a + self.overload_s
        return [(0.0, a, "healthy"), (a, b, "overload"), (b, b + self.recovery_s, "recovery")]

    def lane_mix(self) -> tuple[float, float, float]:
        """The stream's (realtime, standard, bulk) weights."""
        rest = 1.0 - self.realtime_share
        return (self.realtime_share, 0.6 * rest, 0.4 * rest)

    def workload(self) -> list[BenchRequest]:
        """The requests in send order: the stream at each phase's rate, and the burst
        (standard and bulk only) at the start of the overload."""
        merged: list[BenchRequest] = []
        rates = (self.rate, self.overload_rate, self.rate)
        for k, ((a, b, _name), rate) in enumerate(zip(self.phases(), rates, strict=True)):
            spec = WorkloadSpec(
                n=max(1, round(rate * (b - a))),
                seed=self.seed + k,
                rate=rate,
                dup_rate=self.dup_rate,
                lane_mix=self.lane_mix(),
            )
            merged += [
                dataclasses.replace(r, offset_ms=a * 1000.0 + r.offset_ms)
                for r in generate(spec)
                if r.offset_ms < (b - a) * 1000.0
            ]
        burst = WorkloadSpec(
            n=self.burst, seed=self.seed + 10, dup_rate=self.dup_rate, lane_mix=(0, 0.6, 0.4)
        )
        at = self.healthy_s * 1000.0
        merged += [dataclasses.replace(r, offset_ms=at) for r in generate(burst)]
        merged.sort(key=lambda r: r.offset_ms)  # stable: the burst stays in its own order
        return [dataclasses.replace(r, index=i) for i, r in enumerate(merged)]


@dataclass(frozen=True)
class Recording:
    """What a run produced: the curves, the phases, and what was sent and answered."""

    curves: Curves  # with the scenario's phases
    sent: int
    answered: int
    dead_letters: int
    model: dict[str, str]  # pipeline_model_info's labels: name, version, device, task


def record(
    bootstrap: str,
    panels: Sequence[Panel],
    scenario: Scenario,
    workdir: Path,
    *,
    step_s: float = 1.0,
    rate_interval: str | None = None,
    extra_env: dict[str, str] | None = None,
    say: Callable[[str], None] = print,
) -> Recording:
    """Run ``scenario`` against a fresh worker and return ``panels``' curves."""
    env = {
        "PIPELINE_DEGRADE_ENABLED": "true",
        "PIPELINE_SCHEDULER_QUEUE_SIZE": str(scenario.queue_size),
        "PIPELINE_METRICS_SAMPLE_INTERVAL_S": "1",
        **(extra_env or {}),
    }
    dep = Deployment("dashboard", bootstrap=bootstrap, out=workdir, extra_env=env)
    prometheus = LocalPrometheus(
        [f"127.0.0.1:{dep.metrics_port}"], workdir / f"prometheus-{uuid.uuid4().hex[:6]}"
    )
    try:
        say(f"starting a worker (topics {dep.settings.topics.prefix}*, log {dep.log_path})")
        dep.start()
        say(f"worker ready in {dep.ready_s:.0f} s; starting Prometheus on {prometheus.url}")
        prometheus.start()
        prometheus.wait_for('up{job="pipeline"} == 1')
        workload = scenario.workload()
        start = time.time()
        sent, answered = _play(dep, workload, scenario, say)
        say(f"{answered}/{sent} answered; scraping {scenario.tail_s:.0f} s more")
        time.sleep(scenario.tail_s)
        end = time.time()
        assert dep.collector is not None
        dead = sum(1 for a in dep.collector.of("") if a.kind == "dead_letter")
        info = prometheus.client.query("pipeline_model_info")
        model = {k: v for k, v in info[0]["metric"].items() if k != "__name__"} if info else {}
        interval = rate_interval or grafana_rate_interval(step_s, prometheus.interval_s)
        curves = fetch(
            prometheus.client,
            panels,
            start=start,
            end=end,
            step_s=step_s,
            rate_interval=interval,
        )
        phases = scenario.phases()
        phases.append((phases[-1][1], end - start, "no new traffic"))
        curves = dataclasses.replace(curves, phases=phases)
    finally:
        prometheus.stop()
        dep.stop()
    return Recording(curves, sent, answered, dead, model)


def _play(
    dep: Deployment,
    workload: list[BenchRequest],
    scenario: Scenario,
    say: Callable[[str], None],
) -> tuple[int, int]:
    """Send ``workload`` on a thread; return (sent, answered) once all are answered."""
    collector = dep.collector
    assert collector is not None
    prefix = f"dash-{uuid.uuid4().hex[:6]}-"
    with RequestProducer(dep.settings, source="pipeline dashboard") as producer:
        sender = threading.Thread(
            target=send,
            args=(producer, workload),
            kwargs={"prefix": prefix, "collector": collector},
            name="dashboard-sender",
            daemon=True,
        )
        sender.start()
        last = (scenario.phases()[-1][1]) + scenario.answer_timeout_s
        t0, shown = time.monotonic(), 0.0
        while time.monotonic() - t0 < last:
            done = collector.count(prefix)
            if done >= len(workload) and not sender.is_alive():
                break
            if time.monotonic() - shown >= 10:
                shown = time.monotonic()
                say(f"t={shown - t0:4.0f} s: {done}/{len(workload)} answered")
            time.sleep(0.2)
        sender.join(60)
    return len(workload), collector.count(prefix)
