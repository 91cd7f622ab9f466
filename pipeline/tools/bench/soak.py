"""``pipeline bench --soak SECONDS``: one adaptive worker left alone under steady load.

The soak runs its own broker (on free ports, under ``out/work/broker``) because
it restarts it; with ``--bootstrap`` it uses that broker and skips the restart.
It starts one adaptive worker (the bench's :class:`~.modes.Deployment`),
measures its saturated throughput on a short burst of ``calibrate_requests``
(unless ``rate`` is given), then offers ``load`` times that rate open loop
for ``duration_s`` seconds: the bench's workload with few repeats
(``dup_rate``), so most texts are new and every dedupe structure keeps
growing unless it is bounded. At fixed points of the run:

- 1/3: a second worker joins the group (a rebalance);
- 1/2: it leaves (SIGTERM, a second rebalance);
- 2/3: the broker is stopped (SIGTERM) and started again on the same data;
- 3/4 and 5/6: a second worker joins and leaves again, so the first worker looks
  its partitions' start offsets up after the restart (its clients were connected
  before it, and a client connected across a restart may never answer again).

Every ``sample_s`` it reads the first worker's RSS and open file descriptors
(``/proc``), its model process's RSS, its data folder's size on disk
(RocksDB) and the group's consumer lag over the lane topics (:mod:`.soak_probes`).
The workers' logs tell which partitions they held for want of a start offset
(``held_partitions``). Answers come back through the bench's collector, which
also counts request ids answered more than once. :mod:`.soak_report` turns this
into ``soak.json`` and ``soak.png``: the RSS slope after warm-up is
``summary.rss_slope_mib_per_hour``, the warm-up ending where the worker's RocksDB
folder reaches its dedupe stores' memory bound (partitions x
``PIPELINE_DEDUPE_STORE_MEMORY_MIB``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError
from pipeline.kafka.client import RequestProducer
from pipeline.kafka.security import security_env
from pipeline.settings import LANES, Settings
from pipeline.tools.bench import soak_report
from pipeline.tools.bench.drive import wall_ms
from pipeline.tools.bench.modes import Deployment, start_worker
from pipeline.tools.bench.phases import run_phase, say
from pipeline.tools.bench.run import BenchConfig
from pipeline.tools.bench.soak_probes import Lag, Sampler
from pipeline.tools.bench.workload import BenchRequest, WorkloadSpec, generate
from pipeline.tools.kafka_local import LocalKafka
from pipeline.tools.supervise import WorkerProcess, free_port

__all__ = ["SoakConfig", "run_soak", "write_soak"]


@dataclasses.dataclass(frozen=True)
class SoakConfig:
    """What one soak runs (``pipeline bench --soak`` maps its flags here)."""

    duration_s: float
    out: Path = Path("bench-out")
    load: float = 0.5  # of the base rate
    rate: float = 0.0  # base rate (req/s); 0: the worker's saturated throughput, measured
    calibrate_requests: int = 600
    dup_rate: float = 0.05  # most texts never repeat
    seed: int = 7
    sample_s: float = 10.0
    drain_s: float = 120.0  # after the load: the longest wait for the last answers
    device: str | None = None
    worker_env: tuple[tuple[str, str], ...] = ()
    answer_timeout_s: float = 300.0  # the calibration phase's (run_phase reads it)

    def events(self) -> list[tuple[float, str]]:
        """(seconds after the load starts, event), in order."""
        d = self.duration_s
        return [
            (d / 3.0, "worker joins"),
            (d / 2.0, "worker leaves"),
            (2 * d / 3.0, "broker restart"),
            (3 * d / 4.0, "worker joins after the restart"),
            (5 * d / 6.0, "worker leaves after the restart"),
        ]


def _send_steadily(
    producer: RequestProducer,
    workload: list[BenchRequest],
    *,
    prefix: str,
    sent: dict[str, tuple[str, float]],
    stop: threading.Event,
    errors: list[str],
) -> None:
    """Send ``workload`` open loop; a request the producer refuses (the broker down
    long enough) is counted in ``errors``, not raised."""
    t0 = time.monotonic()
    for req in workload:
        delay = req.offset_ms / 1000.0 - (time.monotonic() - t0)
        if stop.wait(delay) if delay > 0 else stop.is_set():
            break
        rid = f"{prefix}{req.index}"
        sent[rid] = (req.lane, wall_ms())
        try:
            producer.send(req.text, lane=req.lane, request_id=rid)
        except PipelineError as exc:
            errors.append(str(exc))
    try:
        producer.flush(120)
    except PipelineError as exc:
        errors.append(str(exc))


def _own_broker(settings: Settings, out: Path) -> LocalKafka:
    local = dataclasses.replace(
        settings.local_kafka, port=free_port(), controller_port=free_port(),
        data_dir=str((out / "work" / "broker").resolve()),
    )  # fmt: skip
    return LocalKafka(local)


@dataclasses.dataclass
class _Run:
    """One soak in progress: what it started, and what it has seen so far."""

    config: SoakConfig
    dep: Deployment
    broker: LocalKafka | None
    prefix: str = dataclasses.field(default_factory=lambda: f"soak-{uuid.uuid4().hex[:6]}-")
    joiner: WorkerProcess | None = None
    joiner_logs: list[Path] = dataclasses.field(default_factory=list)
    sampler: Sampler | None = None
    lag: Lag | None = None
    rate: float = 0.0
    calibration: dict[str, Any] | None = None
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)
    started_ms: float = 0.0

    def calibrate(self) -> None:
        """The offered rate: ``load`` of ``rate``, or of a saturation burst's throughput."""
        config = self.config
        base = config.rate
        if not base:
            spec = WorkloadSpec(n=config.calibrate_requests, seed=config.seed + 100,
                                dup_rate=config.dup_rate)  # fmt: skip
            bench = BenchConfig(answer_timeout_s=config.answer_timeout_s)
            self.calibration = run_phase(self.dep, "calibrate", spec, config=bench)
            base = self.calibration["throughput"]
        self.rate = base * config.load
        say(f"soak: {self.rate:.1f} req/s ({config.load:g} of {base:.1f}/s) "
            f"for {config.duration_s:.0f} s")  # fmt: skip

    def play(self) -> None:
        """The load for ``duration_s``, the events at their times, then the drain."""
        config, dep, collector = self.config, self.dep, self.dep.collector
        assert collector is not None
        n = max(1, int(self.rate * config.duration_s))
        spec = WorkloadSpec(n=n, seed=config.seed, rate=self.rate, dup_rate=config.dup_rate)
        workload = generate(spec)
        data_dir = Path(dep.worker_envs[0]["PIPELINE_WORKER_DATA_DIR"])
        self.lag = Lag(dep.settings)
        stop = threading.Event()
        with RequestProducer(dep.settings, source="pipeline bench soak") as producer:
            producer.connect()
            self.sampler = sampler = Sampler(dep.workers[0], data_dir, self.lag, config.sample_s)
            self.started_ms = wall_ms()
            sender = threading.Thread(
                target=_send_steadily, args=(producer, workload),
                kwargs={"prefix": self.prefix, "sent": collector.sent, "stop": stop,
                        "errors": self.errors},
                name="soak-sender", daemon=True,
            )  # fmt: skip
            sender.start()
            for at_s, name in config.events():
                _sleep_until(sampler.t0 + at_s)
                self.event(name, time.monotonic() - sampler.t0)
            _sleep_until(sampler.t0 + config.duration_s)
            sender.join(config.drain_s)
            stop.set()
            load_end = time.monotonic()
            while time.monotonic() - load_end < config.drain_s:
                if collector.count(self.prefix) >= _sent(dep, self.prefix):
                    break
                time.sleep(1.0)
        sampler.sample()

    def event(self, name: str, t_s: float) -> None:
        say(f"soak: {name} at {t_s:.0f} s")
        detail: dict[str, Any] = {}
        if name.startswith("worker joins"):
            self.joiner = _join(self.dep, self.config.out, len(self.joiner_logs) + 1)
            self.joiner_logs.append(self.joiner.log_path)
            detail["ready_s"] = round(self.joiner.wait_ready(300), 1)
        elif name.startswith("worker leaves") and self.joiner is not None:
            t = time.monotonic()
            detail["exit_code"] = self.joiner.stop()
            detail["stop_s"] = round(time.monotonic() - t, 1)
            self.joiner = None
        elif name == "broker restart":
            if self.broker is None:
                detail["skipped"] = "the broker is not the soak's own (--bootstrap)"
            else:
                t = time.monotonic()
                self.broker.down()
                time.sleep(5.0)  # down long enough for every client to notice
                self.broker.up()
                detail["down_s"] = round(time.monotonic() - t, 1)
        self.events.append({"t_s": round(t_s, 1), "event": name, **detail})

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
        if self.joiner is not None:
            self.joiner.stop()
        self.dep.stop()
        if self.lag is not None:
            self.lag.close()


def run_soak(
    config: SoakConfig, settings: Settings, bootstrap: str | None = None
) -> dict[str, Any]:
    """Run the soak (see the module's promise); return the report's data."""
    config.out.mkdir(parents=True, exist_ok=True)
    broker = None if bootstrap else _own_broker(settings, config.out)
    if broker is not None:
        say(f"soak: starting its own broker on {broker.bootstrap}")
        bootstrap = broker.up()
    assert bootstrap is not None
    env = {**({"PIPELINE_MODEL_DEVICE": config.device} if config.device else {}),
           **({"PIPELINE_MODEL_PATH": settings.model.path} if settings.model.path else {}),
           **dict(config.worker_env), **security_env(settings)}  # fmt: skip
    run = None
    try:
        dep = Deployment("adaptive", bootstrap=bootstrap, out=config.out, extra_env=env)
        run = _Run(config, dep, broker)
        dep.start()
        say(f"soak: worker ready in {dep.ready_s:.1f} s")
        run.calibrate()
        run.play()
        return _report(run)
    finally:
        if run is not None:
            run.close()
        if broker is not None:
            broker.down()
        logs = config.out / "logs"  # the workers' logs outlive their data folders
        for log in (config.out / "work").glob("*.log"):
            logs.mkdir(exist_ok=True)
            shutil.move(log, logs / log.name)
        shutil.rmtree(config.out / "work", ignore_errors=True)


def _sent(dep: Deployment, prefix: str) -> int:
    assert dep.collector is not None
    return sum(1 for rid in list(dep.collector.sent) if rid.startswith(prefix))


def _read(path: Path) -> list[str] | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None


def _sleep_until(deadline: float) -> None:
    time.sleep(max(0.0, deadline - time.monotonic()))


def _join(dep: Deployment, out: Path, nth: int) -> WorkerProcess:
    """The ``nth`` second worker in the first one's group: its own data folder, log
    and ports."""
    name = f"{dep.name}-joiner" + (f"-{nth}" if nth > 1 else "")
    env = {
        **dep.worker_envs[0],
        "PIPELINE_WORKER_DATA_DIR": str(out / "work" / name),
        "PIPELINE_WORKER_WEB_PORT": str(free_port()),
        "PIPELINE_METRICS_PORT": str(free_port()),
    }
    return start_worker(dep.app, env, dep.log_path.with_name(f"{name}.log"))


def _report(run: _Run) -> dict[str, Any]:
    config, collector, sampler, t0 = run.config, run.dep.collector, run.sampler, run.started_ms
    assert collector is not None and sampler is not None
    answers = collector.of(run.prefix)
    realtime = [a for a in answers if a.lane == LANES[0]]
    latencies = [((a.received_ms - t0) / 1000.0, a.received_ms - a.created_at_ms)
                 for a in realtime if a.kind == "result"]  # fmt: skip
    expired = [(a.received_ms - t0) / 1000.0 for a in realtime if a.stage == "expired"]
    repeats = [(ms - t0) / 1000.0 for rid, ms in collector.repeats if rid.startswith(run.prefix)]
    sent = _sent(run.dep, run.prefix)
    worker = Settings.from_env(run.dep.worker_envs[0])  # the bound the worker ran with
    bound = soak_report.store_bound_bytes(worker.dedupe.store_memory_mib, worker.topics.partitions)
    summary = soak_report.summarise(sampler.rows, latencies, bound_bytes=bound,
                                    duration_s=config.duration_s,
                                    new_texts=sent * (1.0 - config.dup_rate))  # fmt: skip
    stages = sorted({a.stage for a in answers if a.stage})
    calibration = run.calibration
    return {
        "config": {k: str(v) if isinstance(v, Path) else v
                   for k, v in dataclasses.asdict(config).items()},
        "machine": {"cpus": len(os.sched_getaffinity(0)), "load_avg_end": os.getloadavg()},
        "offered_rate": run.rate,
        "calibration": calibration and {k: calibration[k] for k in ("throughput", "answered")},
        "sent": sent,
        "answered": len(answers),
        "results": sum(1 for a in answers if a.kind == "result"),
        "dead_letters": {stage: sum(1 for a in answers if a.stage == stage) for stage in stages},
        "unanswered": max(sent - len(answers), 0),
        "producer_errors": {"count": len(run.errors), "first": run.errors[:1]},
        "repeated_answers": len(repeats),
        "repeated_by_event": soak_report.repeats_by_event(repeats, run.events, config.duration_s),
        "events": run.events,
        "held_partitions": {  # None: the log could not be read
            path.name: None if lines is None else soak_report.held_partitions(lines, t0)
            for path in [run.dep.workers[0].log_path, *run.joiner_logs]
            for lines in [_read(path)]
        },
        "summary": summary,
        "per_minute": soak_report.per_minute(latencies, expired, config.duration_s),
        "samples": sampler.rows,
    }  # fmt: skip


def write_soak(report: dict[str, Any], out: Path) -> dict[str, Path]:
    """``soak.json`` and ``soak.png`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "soak.json"
    path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return {"json": path, "plot": soak_report.plot(report, out)}
