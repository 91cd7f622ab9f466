"""One phase against a running deployment: send a workload, wait for its answers, summarise.

- :func:`run_phase`: a workload (saturation, open-loop load, a burst) sent by
  one producer thread; answers counted as they come back;
- :func:`backlog`: a bulk backlog at once, and realtime requests at a slow
  steady rate while it drains (the same sending and counting);
- :func:`after_idle`: single realtime requests, each after ``idle_s`` of
  silence, each waited for before the next silence starts;
- :func:`faust_floor`: the noop saturation workload through a bare Faust
  agent (:mod:`.faust_floor`);
- :class:`Sampler`: a worker's token budget and batches over time, and the GPU's
  utilisation per phase (``--device cuda``).

Every phase also records the model side's forward and interpreter-lock wait
seconds (the workers' /metrics before and after), the model process's peak
RSS beside the worker's, and on ``--device sim`` the simulated device's busy
share (its own counter over the phase's wall time).
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from pipeline.kafka.client import RequestProducer
from pipeline.kafka.security import security_env
from pipeline.settings import LANES, Settings
from pipeline.tools.bench.drive import Collector, FloorCounter, send, wall_ms
from pipeline.tools.bench.stats import (
    Answered,
    batch_stats,
    last_answer_s,
    metric_total,
    model_stats,
    scrape,
    summarize,
)
from pipeline.tools.bench.workload import BenchRequest, WorkloadSpec, generate
from pipeline.tools.bench.workload import backlog as backlog_workload

if TYPE_CHECKING:
    from pipeline.tools.bench.modes import Deployment
    from pipeline.tools.bench.run import BenchConfig

__all__ = ["Sampler", "after_idle", "backlog", "faust_floor", "run_phase", "say"]


def say(message: str) -> None:
    tqdm.write(f"==> {message}", file=sys.stderr)


class Sampler:
    """Scrapes a worker's /metrics every ``interval_s`` on a thread: budget and batches;
    with ``device`` (a :class:`pipeline.inference.DeviceTelemetry`), the GPU's
    utilisation too, read here at each tick rather than from the worker's gauge (which
    it refreshes every ``PIPELINE_METRICS_SAMPLE_INTERVAL_S``, 5 s by default).
    ``phase`` names the phase running now; "" between phases."""

    def __init__(self, port: int, interval_s: float = 0.5, device: Any = None) -> None:
        self.port = port
        self.interval_s = interval_s
        self.device = device
        self.phase = ""
        self.rows: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            s = scrape(self.port)
            if s is None:
                continue
            self.rows.append(
                {
                    "t_s": round(time.monotonic() - self._t0, 3),
                    "phase": self.phase,
                    "budget": metric_total(s, "pipeline_token_budget"),
                    "batches": metric_total(s, "pipeline_batch_size_count"),
                    "items": metric_total(s, "pipeline_batch_size_sum"),
                    "busy": metric_total(s, "pipeline_engine_busy_ratio"),
                    "gpu": self.device.utilisation() if self.device is not None else None,
                }
            )

    def gpu_util(self, phase: str) -> float | None:
        """Mean GPU utilisation (0..1) over ``phase``'s ticks; None without readings."""
        return mean_gpu(self.rows, phase)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        if self.device is not None:
            self.device.close()


def mean_gpu(rows: list[dict[str, Any]], phase: str) -> float | None:
    """Mean of the ``gpu`` readings of ``phase``'s rows; None when there are none."""
    readings = [r["gpu"] for r in rows if r["phase"] == phase and r.get("gpu") is not None]
    return sum(readings) / len(readings) if readings else None


def _summary(
    dep: Deployment, name: str, answers: list[Answered], *, sent: int, started_ms: float
) -> dict[str, Any]:
    settings = dep.settings.worker
    return summarize(
        answers,
        sent=sent,
        started_ms=started_ms,
        deadlines_ms={lane: settings.lane_deadline_ms(lane) for lane in LANES},
    ) | {"phase": name, "workers": len(dep.workers)}


def _play(
    dep: Deployment,
    name: str,
    workload: list[BenchRequest],
    *,
    span_s: float,
    config: BenchConfig,
    sampler: Sampler | None,
    stop_when: Callable[[list[Answered]], bool] | None = None,
) -> tuple[dict[str, Any], list[Answered], float]:
    """Send ``workload`` from one producer thread, wait for its answers (at most
    ``span_s`` plus ``config.answer_timeout_s``), summarise. Sending stops early once
    ``stop_when`` holds for the answers so far; ``sent`` counts what went out.
    Returns the summary, the answers and the wall time (ms) of the first send."""
    assert dep.collector is not None
    prefix = f"{name}-{uuid.uuid4().hex[:6]}-"
    if sampler is not None:
        sampler.phase = name
    before, cpu0, busy0, t0 = dep.scrape(), dep.cpu_s(), dep.device_busy_s(), time.monotonic()
    model0 = dep.model_cpu_s()
    bar = tqdm(
        total=len(workload), desc=f"{dep.mode}/{name}", unit=" ans", file=sys.stderr, disable=None
    )
    collector = dep.collector
    stop = threading.Event()
    with RequestProducer(dep.settings, source="pipeline bench") as producer:
        # Before the clock starts: a cold producer holds its first requests while it
        # connects (100-500 ms measured), which would be charged to the worker.
        producer.connect()
        started: list[float] = []

        def play() -> None:
            started.append(send(producer, workload, prefix=prefix, collector=collector,
                                stop=stop))  # fmt: skip

        sender = threading.Thread(target=play, name="bench-sender", daemon=True)
        sender.start()
        deadline = time.monotonic() + config.answer_timeout_s + span_s
        done, target = 0, len(workload)
        while time.monotonic() < deadline:
            now = collector.count(prefix)
            bar.update(now - done)
            done = now
            if stop_when is not None and not stop.is_set() and stop_when(collector.of(prefix)):
                stop.set()
            if not sender.is_alive():  # what it sent is all there is to wait for
                target = min(target, _sent(collector, prefix))
                if done >= target:
                    break
            time.sleep(0.1)
        stop.set()
        sender.join(60)
    bar.close()
    after, cpu1, busy1, model1 = dep.scrape(), dep.cpu_s(), dep.device_busy_s(), dep.model_cpu_s()
    wall = time.monotonic() - t0
    if sampler is not None:
        sampler.phase = ""
    # The worker publishes the model's totals once a sample interval: wait for one, so
    # that this phase's forwards count in this phase (the worker is idle by now).
    time.sleep(float(dep.env.get("PIPELINE_METRICS_SAMPLE_INTERVAL_S", "1")) + 0.2)
    settled = dep.scrape()
    answers = collector.of(prefix)
    started_ms = started[0] if started else wall_ms()
    summary = _summary(dep, name, answers, sent=_sent(collector, prefix), started_ms=started_ms)
    gpu = sampler.gpu_util(name) if sampler is not None else None
    summary |= {
        "sent_by_lane": _sent_by_lane(collector, prefix),
        **batch_stats(before, after),
        **model_stats(before, settled),
        "tokenize_share": None,
        "cpu_util": (cpu1 - cpu0) / wall if cpu0 is not None and cpu1 is not None else None,
        # The model processes' cores beside the workers' (the same processes throughout).
        "model_cpu_util": (
            (model1[1] - model0[1]) / wall
            if model0 is not None and model1 is not None and model0[0] == model1[0]
            else None
        ),
        "peak_rss_bytes": dep.peak_rss_bytes(),
        "model_peak_rss_bytes": dep.model_peak_rss_bytes(),
        "gpu_util": gpu,
        # The simulated device's busy share (--device sim) from the first send to the
        # last answer (the producer's connection before it is no work of the device's).
        "device_busy": (
            (busy1 - busy0) / summary["elapsed_s"]
            if busy0 is not None and busy1 is not None
            else None
        ),
    }
    return summary, answers, started_ms


def _sent(collector: Collector, prefix: str) -> int:
    return sum(1 for rid in list(collector.sent) if rid.startswith(prefix))


def _sent_by_lane(collector: Collector, prefix: str) -> dict[str, int]:
    out = dict.fromkeys(LANES, 0)
    for rid, (lane, _) in list(collector.sent.items()):
        if rid.startswith(prefix) and lane in out:
            out[lane] += 1
    return out


def run_phase(
    dep: Deployment,
    name: str,
    spec: WorkloadSpec,
    *,
    config: BenchConfig,
    sampler: Sampler | None = None,
) -> dict[str, Any]:
    """Send one workload to ``dep``'s workers and summarise what came back."""
    span_s = spec.n / spec.rate if spec.rate else 0.0
    summary, _, _ = _play(dep, name, generate(spec), span_s=span_s, config=config, sampler=sampler)
    summary |= {"offered_rate": spec.rate or None, "dup_rate": spec.dup_rate}
    say(
        f"{dep.mode}/{name}: {summary['answered']}/{summary['sent']} answered, "
        f"{summary['throughput']:.1f}/s, realtime p99 {summary['latency_ms']['realtime']['p99']}"
        + (f", expired {sum(summary['expired'].values())}" if name.startswith("burst") else "")
    )
    return summary


def backlog(
    dep: Deployment, *, config: BenchConfig, seed: int, sampler: Sampler | None = None
) -> dict[str, Any]:
    """``config.backlog_requests`` bulk requests at once, then realtime requests open
    loop at ``config.backlog_rate`` per second while the bulk drains: the realtime
    stream stops once every bulk request is answered (result or dead letter), and
    in any case after ``round(backlog_rate * backlog_max_s)`` requests (about
    ``backlog_max_s`` seconds): the bound when the backlog does not drain."""
    n, rate = config.backlog_requests, config.backlog_rate
    workload = backlog_workload(n, rate=rate, realtime=round(rate * config.backlog_max_s),
                                seed=seed, dup_rate=config.dup_rate)  # fmt: skip

    def drained(answers: list[Answered]) -> bool:
        return sum(1 for a in answers if a.lane == "bulk") >= n

    summary, answers, started_ms = _play(
        dep, "backlog", workload, span_s=config.backlog_max_s, config=config, sampler=sampler,
        stop_when=drained,
    )  # fmt: skip
    summary |= {
        "offered_rate": None,  # not a load level: a backlog plus a slow realtime stream
        "dup_rate": config.dup_rate,
        "backlog_requests": n,
        "realtime_rate": rate,
        "backlog_max_s": config.backlog_max_s,
        "drain_s": last_answer_s(answers, "bulk", started_ms),
        "drained": drained(answers),
    }
    rt = summary["latency_ms"]["realtime"]
    drain = summary["drain_s"]
    say(
        f"{dep.mode}/backlog: {n} bulk "
        + (f"drained in {drain:.1f} s" if summary["drained"] and drain else "not drained")
        + f", {summary['answered_by_lane']['realtime']} realtime at {rate:g}/s meanwhile: "
        f"p50/p95/p99 {rt['p50']}/{rt['p95']}/{rt['p99']} ms, expired {summary['expired']}"
    )
    return summary


def after_idle(dep: Deployment, *, config: BenchConfig, seed: int) -> dict[str, Any]:
    """``config.idle_requests`` realtime requests, one at a time, each sent after
    ``config.idle_s`` seconds in which nothing was sent and nothing was pending:
    the latency of the first record after a silence."""
    assert dep.collector is not None
    collector = dep.collector
    spec = WorkloadSpec(n=config.idle_requests, seed=seed, dup_rate=0.0, lane_mix=(1, 0, 0))
    workload = generate(spec)
    prefix = f"after-idle-{uuid.uuid4().hex[:6]}-"
    started, cpu0, t0 = wall_ms(), dep.cpu_s(), time.monotonic()
    with RequestProducer(dep.settings, source="pipeline bench") as producer:
        producer.connect()
        for req in workload:
            time.sleep(config.idle_s)
            send(producer, [req], prefix=prefix, collector=collector)
            deadline = time.monotonic() + config.answer_timeout_s
            while collector.count(prefix) <= req.index and time.monotonic() < deadline:
                time.sleep(0.005)
    cpu1, wall = dep.cpu_s(), time.monotonic() - t0
    summary = _summary(
        dep, "after-idle", collector.of(prefix), sent=len(workload), started_ms=started
    )
    latencies = sorted(
        a.received_ms - a.created_at_ms for a in collector.of(prefix) if a.kind == "result"
    )
    summary |= {
        "throughput": None,  # one request at a time: latency is the measure
        "cpu_util": (cpu1 - cpu0) / wall if cpu0 is not None and cpu1 is not None else None,
        "idle_s": config.idle_s,
        "latencies_ms": [round(v, 1) for v in latencies],
        "peak_rss_bytes": dep.peak_rss_bytes(),
        "model_peak_rss_bytes": dep.model_peak_rss_bytes(),
    }
    say(
        f"{dep.mode}/after-idle ({config.idle_s:g} s silences): "
        f"{summary['answered']}/{summary['sent']} answered, realtime p50/p99 "
        f"{summary['latency_ms']['realtime']['p50']}/{summary['latency_ms']['realtime']['p99']}"
        f" ms, slowest {latencies[-3:]}"
    )
    return summary


def faust_floor(config: BenchConfig, bootstrap: str, settings: Settings) -> dict[str, Any]:
    """noop's saturation workload through ``config.workers`` bare Faust agents:
    events/s from the first send to the last copy seen on the results topic."""
    from pipeline.tools.bench.modes import Deployment

    dep = Deployment(
        "faust-floor",
        bootstrap=bootstrap,
        out=config.out,
        extra_env=security_env(settings),
        workers=config.workers,
        app="pipeline.tools.bench.faust_floor",
        keep_topics=config.keep_topics,
    )
    workload = generate(WorkloadSpec(n=config.noop_requests, seed=config.seed,
                                     dup_rate=config.dup_rate))  # fmt: skip
    say(f"faust-floor: {len(workload)} events through {config.workers} bare Faust agent(s)")
    counter = None
    try:
        dep.start(collect=False)
        counter = FloorCounter(dep.settings)
        with RequestProducer(dep.settings, source="pipeline bench") as producer:
            producer.connect()
            cpu0, t0 = dep.cpu_s(), time.monotonic()
            started = send(producer, workload, prefix="faust-floor-", collector=counter)
            while counter.count < len(workload) and time.monotonic() - t0 < config.answer_timeout_s:
                time.sleep(0.05)
            cpu1, wall = dep.cpu_s(), time.monotonic() - t0
        answered = min(counter.count, len(workload))
        phase = {
            "phase": "saturate",
            "workers": config.workers,
            "sent": len(workload),
            "answered": answered,
            "unanswered": len(workload) - answered,
            "throughput": answered / max((counter.last_ms - started) / 1000.0, 1e-3),
            "cpu_util": (cpu1 - cpu0) / wall if cpu0 is not None and cpu1 is not None else None,
            "peak_rss_bytes": dep.peak_rss_bytes(),
        }
    finally:
        if counter is not None:
            counter.close()
        dep.stop()
    say(f"faust-floor: {phase['throughput']:.0f} events/s")
    return {"mode": "faust-floor", "ready_s": dep.ready_s, "phases": [phase], "timeline": []}
