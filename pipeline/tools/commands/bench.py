"""``pipeline bench``: throughput and latency of every mode on the real broker.

This file is the command's surface: its flags, their checks and its help. What the
parsed flags run (the modes' :class:`~pipeline.tools.bench.run.BenchConfig`, or the
soak) is :mod:`.bench_run`.
"""

from __future__ import annotations

from pathlib import Path

import click
from click.core import ParameterSource

from pipeline.settings import Settings
from pipeline.settings.serving import SIM_PROFILES
from pipeline.tools.bench.run import DEFAULT_MODES, MODES
from pipeline.tools.commands.options import bootstrap_option, keep_broker_option, seed_option

__all__ = ["bench"]


def _modes(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in value.split(",") if m.strip())
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise click.BadParameter(f"{', '.join(unknown) or 'none'}: choose from {', '.join(MODES)}")
    return modes


def _threads(_ctx: click.Context, _param: click.Parameter, value: str | None) -> tuple[str, ...]:
    from pipeline.tools.bench.threads import parse_settings

    try:
        return parse_settings(value or "")
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _loads(_ctx: click.Context, _param: click.Parameter, value: str | None) -> tuple[float, ...]:
    if value is None:
        return ()
    try:
        loads = tuple(float(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter("expected fractions like 0.5,0.8") from None
    if not loads or min(loads) <= 0:
        raise click.BadParameter("expected positive fractions like 0.5,0.8")
    return loads


def _sets(
    _ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]
) -> tuple[tuple[str, str], ...]:
    from pipeline.errors import ConfigurationError
    from pipeline.settings import Settings

    pairs = []
    for item in value:
        name, eq, raw = item.partition("=")
        if not eq or not name.startswith("PIPELINE_"):
            raise click.BadParameter(f"{item!r}: expected PIPELINE_NAME=VALUE")
        try:
            Settings.from_env({name: raw})
        except ConfigurationError as exc:
            raise click.BadParameter(str(exc)) from None
        pairs.append((name, raw))
    return tuple(pairs)


@click.command("bench")
@bootstrap_option
@click.option(
    "--modes",
    default=",".join(DEFAULT_MODES),
    show_default=True,
    callback=_modes,
    help="Comma-separated: raw (model alone, no Kafka: the workload sorted by tokens, "
    "batches cut by a token budget), st (sentence-transformers' encode on the same texts "
    "and device; n/a on sim), adaptive (defaults), fixed (fixed "
    "batch and wait), sync (one request per model call), noop (pipeline with a no-op model), "
    "faust-floor (a bare Faust agent: raw bytes in, one produce per event), "
    "floor (plain confluent-kafka consume/produce loop), fleets (only when named: the "
    "backlog phase on max(--workers, 2) mixed workers, then on the same split into a "
    "realtime fleet of --fleet-realtime-workers and a batch fleet).",
)
@click.option("--quick", is_flag=True, help="Smoke run: small N, a few seconds per mode (CI).")
@click.option(
    "--requests",
    "-n",
    type=click.IntRange(1),
    default=None,
    help="Requests per saturation phase [1000; 6000 on sim and cuda, where 1000 last "
    "half a second and the phase's start and end weigh on its rate; quick 60].",
)
@click.option(
    "--noop-requests",
    type=click.IntRange(1),
    default=None,
    help="Events for noop and the floor loop [10000; quick 400].",
)
@click.option(
    "--duration",
    type=click.FloatRange(0.5),
    default=None,
    help="Seconds of each open-loop load phase [20; quick 3].",
)
@click.option(
    "--rate",
    type=click.FloatRange(0),
    default=0.0,
    help="Base offered rate (req/s) of the load phases; 0: adaptive's saturated throughput.",
)
@click.option(
    "--loads",
    default=None,
    callback=_loads,
    help="Fractions of the base rate to offer open loop [0.5,0.8; quick 0.8].",
)
@click.option(
    "--dup-rate",
    type=click.FloatRange(0, 1),
    default=0.2,
    show_default=True,
    help="Share of requests repeating a hot text (Zipf-skewed hot set).",
)
@seed_option
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("bench-out"),
    show_default=True,
    help="Folder for bench.json, bench.md and the PNG plots.",
)
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda", "sim"]),
    default=None,
    help="Model device (sets PIPELINE_MODEL_DEVICE for every worker, raw and st). sim: the "
    "simulated accelerator (real tokenizer, a GPU's host costs; one device file per run).",
)
@click.option(
    "--sim-profile",
    type=click.Choice(SIM_PROFILES),
    default="eager",
    show_default=True,
    help="With --device sim: what a forward costs the host (PIPELINE_MODEL_SIM_PROFILE of "
    "every worker and raw): eager, traced, graphed, or slow (a device slower than the pipeline).",
)
@click.option(
    "--fixed-batch",
    type=click.IntRange(1),
    default=32,
    show_default=True,
    help="Batch size of the fixed mode.",
)
@click.option(
    "--fixed-wait-ms",
    type=click.IntRange(0),
    default=20,
    show_default=True,
    help="Batch wait of the fixed mode.",
)
@click.option(
    "--threads",
    default=None,
    callback=_threads,
    help="Thread-budget sweep after the modes, e.g. 1,2 or 1:1,2:0,1:1:-1 (T torch threads, "
    "K tokenizer threads, H hand-over ms on a GPU; <0: no overlap; a CPU worker never overlaps): "
    "per setting the model alone, "
    "serial and pipelined, and an adaptive worker's saturation phase.",
)
@click.option(
    "--workers",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Worker processes per mode, side by side in one consumer group (own ports and data "
    "folders); noop and faust-floor report events/s of all of them together.",
)
@click.option(
    "--fleet-realtime-workers",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="fleets: workers of the realtime fleet in the split layout (the rest consume "
    "standard and bulk).",
)
@click.option(
    "--burst",
    "burst_requests",
    type=click.IntRange(0),
    default=None,
    help="Requests of adaptive's burst phase, all at once into the idle worker [1000; quick "
    "60; 0: no burst phase].",
)
@click.option(
    "--burst-small",
    "burst_small_requests",
    type=click.IntRange(0),
    default=None,
    help="Requests of adaptive's burst-small phase, at once into the idle worker after the "
    "burst: a burst whose realtime part (10 %) the model can finish within its deadline, so "
    "none should expire [300; quick 30; 0: none].",
)
@click.option(
    "--backlog",
    "backlog_requests",
    type=click.IntRange(0),
    default=None,
    help="Bulk requests of adaptive's backlog phase, all at once into the idle worker, with "
    "realtime requests at 10/s until they are all answered [1500; 8000 on sim and cuda; "
    "quick 100; 0: no backlog phase].",
)
@click.option(
    "--backlog-max-s",
    type=click.FloatRange(1),
    default=None,
    help="Longest realtime stream of the backlog phase, in seconds, should the bulk not "
    "drain sooner [60; quick 10].",
)
@click.option(
    "--idle-requests",
    type=click.IntRange(0),
    default=None,
    help="Realtime requests of noop's after-idle phase, each after --idle-s of silence "
    "[10; quick 3; 0: no after-idle phase].",
)
@click.option(
    "--idle-s",
    type=click.FloatRange(0),
    default=None,
    help="Seconds of silence before the burst, the backlog and each after-idle request "
    "[3; quick 1].",
)
@click.option(
    "--set",
    "worker_env",
    multiple=True,
    callback=_sets,
    metavar="PIPELINE_NAME=VALUE",
    help="A setting for every pipeline worker of the run (repeatable; after the mode's own, "
    "recorded in bench.json), e.g. --set PIPELINE_SCHEDULER_FLOW_THRESHOLD=0.5.",
)
@click.option(
    "--keep-topics",
    is_flag=True,
    help="Leave each mode's topics (bench-<mode>-<tag>.*, and Faust's) on the broker to "
    "inspect; by default they are deleted when the mode ends.",
)
@click.option(
    "--soak",
    "soak_s",
    type=click.FloatRange(30),
    default=None,
    metavar="SECONDS",
    help="Instead of the modes: one adaptive worker for SECONDS at 50 % of its saturated "
    "throughput (--rate sets the base, --loads' first fraction the share, -n the calibration "
    "burst), mostly new texts (--dup-rate, 0.05 unless given), a second worker joining at 1/3 "
    "and leaving at 1/2, the broker restarted at 2/3 (its own broker; none with --bootstrap), "
    "a second worker joining at 3/4 and leaving at 5/6. Writes soak.json (RSS slope after "
    "warm-up, fds, RocksDB size, lag, realtime p99 per minute, repeated answers, partitions "
    "held for want of a start offset) and soak.png into --out.",
)
@keep_broker_option
@click.pass_obj
def bench(  # noqa: PLR0917  (one parameter per flag, as click passes them)
    settings: Settings,
    bootstrap: str | None,
    modes: tuple[str, ...],
    quick: bool,
    requests: int | None,
    noop_requests: int | None,
    duration: float | None,
    rate: float,
    loads: tuple[float, ...],
    dup_rate: float,
    seed: int,
    out: Path,
    device: str | None,
    sim_profile: str,
    fixed_batch: int,
    fixed_wait_ms: int,
    threads: tuple[str, ...],
    workers: int,
    fleet_realtime_workers: int,
    burst_requests: int | None,
    burst_small_requests: int | None,
    backlog_requests: int | None,
    backlog_max_s: float | None,
    idle_requests: int | None,
    idle_s: float | None,
    worker_env: tuple[tuple[str, str], ...],
    keep_topics: bool,
    soak_s: float | None,
    keep_broker: bool,
) -> None:
    """Benchmark the pipeline against its baselines on a real broker and worker.

    Every mode gets the same seeded workload (mostly short texts with a long
    tail; 10 % realtime, 60 % standard, 30 % bulk; --dup-rate repeats of a
    Zipf-skewed hot set), through a real `faust -A pipeline.app worker`
    process with its own topics (--workers of them side by side). Phases:
    saturation (throughput), open-loop load at --loads x the base rate
    (latency per lane, adaptive and fixed), 0 % vs 50 % duplicates, a burst
    into the idle worker and realtime at 10/s while a bulk backlog drains
    (adaptive), 0 % duplicates (noop beside adaptive, for F0) and single
    realtime requests after silences (noop's after-idle).
    Writes bench.json, bench.md (a table and the targets) and PNG plots into
    --out.

    Without --bootstrap, the local broker is started (or reused) as by
    `pipeline kafka up`, and stopped afterwards if this command started it.

    \b
    Examples:
      pipeline bench --quick --modes noop,adaptive      # smoke test, ~1 minute
      pipeline bench --out docs/bench                   # the full run, ~10 minutes on 2 cores
      pipeline bench --device cuda --modes raw,st,adaptive,sync --requests 5000
      pipeline bench --device sim --sim-profile graphed --modes raw,adaptive,noop  # the feed
      pipeline bench --modes raw --threads 1:1,2:1,2:0,1:1:-1   # the thread budget
      pipeline bench --modes noop,faust-floor,floor --workers 2  # two workers per host
      pipeline bench --modes adaptive -n 100 --loads 0.8 --burst 0  # little but the backlog
      pipeline bench --modes adaptive --set PIPELINE_SCHEDULER_FLOW_THRESHOLD=0.5  # A/B a setting
      pipeline bench --modes fleets --workers 2   # one fleet or two, on the backlog
    """
    from pipeline.tools.commands.bench_run import modes_config, run_modes, run_soak

    if soak_s is not None:
        given = click.get_current_context().get_parameter_source("dup_rate")
        run_soak(settings, bootstrap, soak_s, out=out, rate=rate, loads=loads,
                 requests=requests, dup_rate=None if given == ParameterSource.DEFAULT else dup_rate,
                 seed=seed, device=device, worker_env=worker_env)  # fmt: skip
        return
    config = modes_config(
        quick=quick, modes=modes, requests=requests, noop_requests=noop_requests,
        duration=duration, rate=rate, loads=loads, dup_rate=dup_rate, seed=seed, out=out,
        device=device, sim_profile=sim_profile, fixed_batch=fixed_batch,
        fixed_wait_ms=fixed_wait_ms, threads=threads, workers=workers,
        fleet_realtime_workers=fleet_realtime_workers, burst_requests=burst_requests,
        burst_small_requests=burst_small_requests, backlog_requests=backlog_requests,
        backlog_max_s=backlog_max_s, idle_requests=idle_requests, idle_s=idle_s,
        worker_env=worker_env, keep_topics=keep_topics,
    )  # fmt: skip
    run_modes(config, settings, bootstrap, keep_broker=keep_broker)
