"""Run the benchmark: every mode, its phases, and the report.

Phases (each mode sees the same workloads: phase k uses seed + k):

- ``saturate``: ``requests`` requests sent as fast as possible; throughput;
- ``load-<pct>``: open loop at ``pct`` % of the base rate (``--rate``, else
  adaptive's saturated throughput) for ``duration_s``; latency under load
  (adaptive and fixed);
- ``dup-0`` / ``dup-50``: saturation at 0 % and 50 % duplicates (adaptive);
- ``burst``: ``burst_requests`` at once into the adaptive worker after
  ``idle_s`` of silence (the seed's case);
- ``burst-small``: ``burst_small_requests`` the same way, a burst whose
  realtime part fits what the model can finish within its deadline
  (:mod:`.goodput`'s ``C``);
- ``backlog``: ``backlog_requests`` bulk requests at once into the adaptive
  worker after ``idle_s`` of silence, and realtime requests at
  ``backlog_rate`` per second until the bulk is answered (at most
  ``backlog_max_s`` seconds of them);
- noop, faust-floor and the floor: ``noop_requests`` events at saturation;
- ``dup-0`` (noop, when adaptive runs too): ``noop_requests`` new texts only,
  adaptive's ``dup-0`` texts (the feed's F0, context beside F);
- ``after-idle`` (noop): ``idle_requests`` single realtime requests, each
  after ``idle_s`` of silence.

Modes run in the order raw, st, adaptive, fixed, sync, noop, faust-floor,
floor, ``workers`` worker processes of one mode at a time, each mode stopped
before the next starts; ``fleets`` (only when asked for) last: the backlog
phase on max(``workers``, 2) mixed workers, then on the same number split
into a realtime fleet and a batch fleet (:mod:`.fleets`). ``raw`` and ``st``
are the model alone (:mod:`.alone`); ``st`` is n/a on ``--device sim``, where
every worker and raw share one simulated device, a file of this run's own
(``work/sim-device`` under ``out``), so its busy counter holds this run's work
alone. Then, when ``threads``
lists settings, the thread-budget sweep (:mod:`.threads`): per setting the
model alone (serial and pipelined) and an adaptive worker's saturation phase.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from pipeline.kafka.security import security_env
from pipeline.kafka.topics import create_topics
from pipeline.settings import Settings
from pipeline.tools.bench.alone import run_raw, run_st
from pipeline.tools.bench.drive import floor_loop
from pipeline.tools.bench.fleets import run_fleets
from pipeline.tools.bench.modes import WORKER_MODES, Deployment, mode_env, model_settings_for
from pipeline.tools.bench.phases import Sampler, after_idle, backlog, faust_floor, run_phase, say
from pipeline.tools.bench.stats import ProcProbe
from pipeline.tools.bench.threads import ThreadSetting, raw_threads
from pipeline.tools.bench.workload import WorkloadSpec, generate

__all__ = ["DEFAULT_MODES", "MODES", "BenchConfig", "run_bench"]

MODES = ("raw", "st", "adaptive", "fixed", "sync", "noop", "faust-floor", "floor", "fleets")
#: What a run without --modes runs: all but ``fleets`` (several workers, two backlogs).
DEFAULT_MODES = MODES[:-1]


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """What ``pipeline bench`` runs (flags map one to one)."""

    modes: tuple[str, ...] = DEFAULT_MODES
    requests: int = 1000
    noop_requests: int = 10000
    duration_s: float = 20.0
    rate: float = 0.0
    loads: tuple[float, ...] = (0.5, 0.8)
    dup_rate: float = 0.2
    seed: int = 7
    out: Path = Path("bench-out")
    device: str | None = None
    fixed_batch: int = 32
    fixed_wait_ms: int = 20
    raw_budgets: tuple[int, ...] = (256, 512, 1024, 2048)  # raw's padded tokens a batch
    st_sizes: tuple[int, ...] = (8, 32, 128)  # sentence-transformers' batch sizes (32: its default)
    sim_profile: str = "eager"  # --device sim: PIPELINE_MODEL_SIM_PROFILE of raw and workers
    answer_timeout_s: float = 300.0
    threads: tuple[str, ...] = ()
    workers: int = 1  # worker processes per mode, side by side (one consumer group)
    burst_requests: int = 1000  # adaptive's burst phase; 0: none
    burst_small_requests: int = 300  # adaptive's burst-small phase (its realtime within C); 0: none
    backlog_requests: int = 1500  # adaptive's backlog phase (bulk); 0: none
    backlog_rate: float = 10.0  # its realtime requests per second while the bulk drains
    backlog_max_s: float = 60.0  # the bound on that realtime stream, should the bulk not drain
    idle_requests: int = 10  # noop's after-idle phase; 0: none
    idle_s: float = 3.0  # the silence before a burst and before each after-idle request
    worker_env: tuple[tuple[str, str], ...] = ()  # --set: PIPELINE_* for every pipeline worker
    fleet_realtime_workers: int = 1  # fleets: workers of the realtime fleet (of max(workers, 2))
    keep_topics: bool = False  # leave each mode's topics on the broker (deleted otherwise)

    @classmethod
    def quick(cls, **changes: Any) -> BenchConfig:
        """A smoke run: a few seconds per mode."""
        base = cls(requests=60, noop_requests=400, duration_s=3.0, loads=(0.8,), raw_budgets=(512,),
                   st_sizes=(32,),
                   burst_requests=60, burst_small_requests=30, backlog_requests=100,
                   backlog_max_s=10.0,
                   idle_requests=3, idle_s=1.0)  # fmt: skip
        return dataclasses.replace(base, **changes)


def _worker_mode(
    mode: str, config: BenchConfig, bootstrap: str, base_rate: float | None, settings: Settings
) -> dict[str, Any]:
    extra = mode_env(
        mode,
        fixed_batch=config.fixed_batch,
        fixed_wait_ms=config.fixed_wait_ms,
        max_length=settings.model.max_length,
    )
    extra |= _model_env(config, settings)
    extra.update(config.worker_env)
    # The security variables go to the worker but not into the report (``extra``).
    env = {**extra, **security_env(settings)}
    dep = Deployment(
        mode, bootstrap=bootstrap, out=config.out, extra_env=env, workers=config.workers,
        device_file=_sim_file(config) if config.device == "sim" else None,
        keep_topics=config.keep_topics,
    )  # fmt: skip
    say(
        f"{mode}: starting {config.workers} worker(s) "
        f"(topics {dep.settings.topics.prefix}*, logs {dep.log_path.parent}/{dep.name}-*.log)"
    )
    phases: list[dict[str, Any]] = []
    sampler = None
    try:
        dep.start()
        say(f"{mode}: ready in {dep.ready_s:.1f} s")
        # The timeline is adaptive's; fixed and sync are sampled only for the GPU's reading.
        gpu = _gpu(config) if mode in ("adaptive", "fixed", "sync") else None
        if mode == "adaptive" or gpu is not None:
            sampler = Sampler(dep.metrics_port, device=gpu)
        n = config.noop_requests if mode == "noop" else config.requests
        spec = WorkloadSpec(n=n, seed=config.seed, dup_rate=config.dup_rate)
        phases.append(run_phase(dep, "saturate", spec, config=config, sampler=sampler))
        if mode in ("adaptive", "fixed"):
            base = base_rate or phases[0]["throughput"]
            for k, load in enumerate(config.loads, 1):
                rate = base * load
                n = max(10, int(rate * config.duration_s))
                load_spec = WorkloadSpec(
                    n=n, seed=config.seed + k, rate=rate, dup_rate=config.dup_rate
                )
                name = f"load-{round(load * 100)}"
                phases.append(run_phase(dep, name, load_spec, config=config, sampler=sampler))
        if mode == "adaptive":
            for k, dup in enumerate((0.0, 0.5), 10):
                dup_spec = WorkloadSpec(n=config.requests, seed=config.seed + k, dup_rate=dup)
                name = f"dup-{round(dup * 100)}"
                phases.append(run_phase(dep, name, dup_spec, config=config, sampler=sampler))
            if config.burst_requests:
                # The seed's case: a burst into a warm worker that has been idle.
                time.sleep(config.idle_s)
                burst = WorkloadSpec(
                    n=config.burst_requests, seed=config.seed + 20, dup_rate=config.dup_rate
                )
                phases.append(run_phase(dep, "burst", burst, config=config, sampler=sampler))
            if config.burst_small_requests:
                # A burst whose realtime part the model can finish within its deadline
                # (goodput's C): there nothing should expire.
                time.sleep(config.idle_s)
                small = WorkloadSpec(
                    n=config.burst_small_requests, seed=config.seed + 21, dup_rate=config.dup_rate
                )
                phases.append(run_phase(dep, "burst-small", small, config=config, sampler=sampler))
            if config.backlog_requests:
                time.sleep(config.idle_s)
                phases.append(backlog(dep, config=config, seed=config.seed + 40, sampler=sampler))
        if mode == "noop" and "adaptive" in config.modes:
            # adaptive's dup-0 texts (same seed), for F0 (feed.py): on the saturation
            # workload a fifth of noop's requests are repeats the store answers.
            dup_spec = WorkloadSpec(n=config.noop_requests, seed=config.seed + 10, dup_rate=0.0)
            phases.append(run_phase(dep, "dup-0", dup_spec, config=config))
        if mode == "noop" and config.idle_requests:
            phases.append(after_idle(dep, config=config, seed=config.seed + 30))
    finally:
        if sampler is not None:
            sampler.close()
        dep.stop()
    return {
        "mode": mode,
        "env": extra,
        "ready_s": dep.ready_s,
        "phases": phases,
        "timeline": sampler.rows if sampler is not None else [],
    }


def _sim_file(config: BenchConfig) -> Path:
    """This run's simulated device (``--device sim``): one file under ``out``."""
    return config.out / "work" / "sim-device"


def _model_env(config: BenchConfig, settings: Settings) -> dict[str, str]:
    """The PIPELINE_MODEL_* of every model this run loads (workers, raw, the sweep)."""
    env = {"PIPELINE_MODEL_DEVICE": config.device} if config.device else {}
    if settings.model.path:
        env["PIPELINE_MODEL_PATH"] = settings.model.path
    if config.device == "sim":
        env["PIPELINE_MODEL_SIM_PROFILE"] = config.sim_profile
        env["PIPELINE_MODEL_SIM_FILE"] = str(_sim_file(config).resolve())
    return env


def _alone(config: BenchConfig, settings: Settings, mode: str) -> dict[str, Any]:
    """raw or st: the model alone on the saturation workload's texts."""
    texts = [r.text for r in generate(WorkloadSpec(n=config.requests, seed=config.seed))]
    model = model_settings_for(settings, config.device)
    if config.device == "sim":
        model = dataclasses.replace(
            model, sim_profile=config.sim_profile, sim_file=str(_sim_file(config).resolve())
        )
    if mode == "st":
        if config.device == "sim":
            say("st: n/a on the simulated device (it has no network to run)")
            return {"mode": "st", "skipped": "n/a on --device sim", "phases": [], "timeline": []}
        say(f"st: sentence-transformers' encode on {len(texts)} texts, sizes {config.st_sizes}")
        result = run_st(model, texts, sizes=config.st_sizes, sweep_n=_sweep_n(config))
        say(f"st: {result['throughput']:.1f}/s at batch {result['best_batch_size']}")
    else:
        say(f"raw: the model alone on {len(texts)} texts, token budgets {config.raw_budgets}")
        result = run_raw(model, texts, budgets=config.raw_budgets, sweep_n=_sweep_n(config))
        say(
            f"raw: {result['throughput']:.1f}/s at a budget of {result['best_budget']} tokens "
            f"({result['mean_batch_size']:.1f} texts a batch)"
        )
    return {"mode": mode, "phases": [{"phase": "saturate", **result}], "timeline": []}


def _sweep_n(config: BenchConfig) -> int:
    """Texts each budget (batch size) is tried on: several batches of the largest
    budget at ~16 tokens a text, 256 at least."""
    return max(256, max(config.raw_budgets) // 8)


def _gpu(config: BenchConfig) -> Any:
    """NVML readings of GPU 0 for the phases' ``gpu_util``, with ``--device cuda`` only
    (it imports torch); None otherwise."""
    if config.device != "cuda":
        return None
    from pipeline.inference.telemetry import DeviceTelemetry

    telemetry = DeviceTelemetry("cuda:0")
    return telemetry if telemetry.available else None


def _floor(config: BenchConfig, bootstrap: str, settings: Settings) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    env = {
        "PIPELINE_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "PIPELINE_TOPICS_PREFIX": f"bench-floor-{tag}.",
        **security_env(settings),
    }
    settings = Settings.from_env(env)
    create_topics(settings)
    texts = [r.text for r in generate(WorkloadSpec(n=config.noop_requests, seed=config.seed))]
    say(f"floor: {len(texts)} events through a plain confluent-kafka consume/produce loop")
    probe = ProcProbe(os.getpid())
    cpu0, t0 = probe.cpu_s(), time.monotonic()
    rate = floor_loop(settings, texts)
    cpu1 = probe.cpu_s()
    phase = {
        "phase": "saturate",
        "sent": len(texts),
        "answered": len(texts),
        "throughput": rate,
        "cpu_util": (cpu1 - cpu0) / (time.monotonic() - t0) if cpu0 and cpu1 else None,
    }
    say(f"floor: {rate:.0f} events/s")
    return {"mode": "floor", "phases": [phase], "timeline": []}


def _thread_sweep(
    config: BenchConfig, bootstrap: str, settings: Settings, size: int
) -> list[dict[str, Any]]:
    """Per thread setting: the model alone (serial, pipelined) and an adaptive worker."""
    texts = [r.text for r in generate(WorkloadSpec(n=config.requests, seed=config.seed))]
    texts = sorted(texts, key=len)
    model_env = _model_env(config, settings)
    rows = []
    for spec in config.threads:
        setting = ThreadSetting(spec)
        say(f"threads {spec}: the model alone, batch {size}, serial and pipelined")
        raw = raw_threads(setting, texts, size=size, env=model_env)
        env = {**model_env, **dict(config.worker_env), **setting.env(), **security_env(settings)}
        dep = Deployment("adaptive", bootstrap=bootstrap, out=config.out, extra_env=env,
                         keep_topics=config.keep_topics)  # fmt: skip
        workload = WorkloadSpec(n=config.requests, seed=config.seed, dup_rate=config.dup_rate)
        try:
            dep.start()
            phase = run_phase(dep, f"threads-{spec}", workload, config=config)
        finally:
            dep.stop()
        rows.append(
            {
                "setting": spec,
                "env": setting.env(),
                "raw": raw,
                "adaptive": phase["throughput"],
                "adaptive_cpu": phase.get("cpu_util"),
                "adaptive_per_core": (
                    phase["throughput"] / phase["cpu_util"] if phase.get("cpu_util") else None
                ),
                "adaptive_realtime_p99_ms": phase["latency_ms"]["realtime"]["p99"],
                "adaptive_mean_batch": phase.get("mean_batch_size"),
                "answered": phase["answered"],
                "sent": phase["sent"],
            }
        )
    return rows


def run_bench(config: BenchConfig, settings: Settings, bootstrap: str) -> dict[str, Any]:
    """Run ``config.modes`` against the broker at ``bootstrap``; return the report data."""
    config.out.mkdir(parents=True, exist_ok=True)
    if config.device == "sim":  # a fresh device: its counter is this run's alone
        _sim_file(config).unlink(missing_ok=True)
    started = time.time()
    modes: dict[str, Any] = {}
    base_rate = config.rate or None
    for mode in (m for m in MODES if m in config.modes):
        if mode in ("raw", "st"):
            modes[mode] = _alone(config, settings, mode)
        elif mode in WORKER_MODES:
            modes[mode] = _worker_mode(mode, config, bootstrap, base_rate, settings)
            if mode == "adaptive" and base_rate is None:
                base_rate = modes[mode]["phases"][0]["throughput"]
        elif mode == "faust-floor":
            modes[mode] = faust_floor(config, bootstrap, settings)
        elif mode == "floor":
            modes["floor"] = _floor(config, bootstrap, settings)
        elif mode == "fleets":
            modes["fleets"] = run_fleets(config, bootstrap, settings, _model_env(config, settings))
    threads = []
    if config.threads:
        size = round(modes.get("raw", {}).get("phases", [{}])[0].get("best_batch_size", 8))
        threads = _thread_sweep(config, bootstrap, settings, size)
    shutil.rmtree(config.out / "work", ignore_errors=True)  # RocksDB folders and worker logs
    return {
        "config": {
            k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(config).items()
        },
        "machine": _machine(config.device),
        "started_at": started,
        "elapsed_s": time.time() - started,
        "modes": modes,
        **({"threads": threads} if threads else {}),
    }


def _machine(device: str | None) -> dict[str, Any]:
    import platform

    info: dict[str, Any] = {
        "cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device_flag": device,
    }
    try:
        import torch

        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        info["torch"] = torch.__version__
    except Exception:
        info["cuda"] = None
    return info
