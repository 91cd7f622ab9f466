"""What ``pipeline bench`` runs once its flags are parsed (:mod:`.bench`): the modes,
with a :class:`~pipeline.tools.bench.run.BenchConfig` built from the flags given, or
the soak (:mod:`pipeline.tools.bench.soak`). A flag left out keeps the config's
default; on an accelerator (sim, cuda) the model alone tries larger token budgets
and each saturation phase sends more requests.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import click

from pipeline.settings import Settings
from pipeline.tools.bench.run import BenchConfig
from pipeline.tools.commands.options import local_broker_unless

__all__ = ["ACCELERATOR_BACKLOG", "ACCELERATOR_REQUESTS", "modes_config", "run_modes", "run_soak"]

#: Requests per saturation phase on an accelerator (sim, cuda) unless -n says: at
#: ~2,000 texts/s (the slow simulated device) 1,000 last half a second.
ACCELERATOR_REQUESTS = 6000
#: Bulk requests of the backlog phase on an accelerator unless --backlog says: on the
#: slow simulated device 1,500 drained in 0.6 s (about 24 batches, the phase's start
#: and end weighing on their mean), 8,000 in 3.2-3.3 s.
ACCELERATOR_BACKLOG = 8000


def modes_config(
    *,
    quick: bool,
    modes: tuple[str, ...],
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
    keep_topics: bool = False,
) -> BenchConfig:
    """The modes' run: :class:`BenchConfig`'s defaults (``quick``'s with --quick), each
    flag given (not None, ``loads`` not empty) in its field's place."""
    config = BenchConfig.quick() if quick else BenchConfig()
    changes: dict[str, object] = {
        "modes": modes,
        "dup_rate": dup_rate,
        "seed": seed,
        "out": out,
        "device": device,
        "sim_profile": sim_profile,
        "rate": rate,
        "fixed_batch": fixed_batch,
        "fixed_wait_ms": fixed_wait_ms,
        "threads": threads,
        "workers": workers,
        "fleet_realtime_workers": fleet_realtime_workers,
        "worker_env": worker_env,
        "keep_topics": keep_topics,
    }
    if loads:
        changes["loads"] = loads
    for name, value in (
        ("requests", requests),
        ("noop_requests", noop_requests),
        ("duration_s", duration),
        ("burst_requests", burst_requests),
        ("burst_small_requests", burst_small_requests),
        ("backlog_requests", backlog_requests),
        ("backlog_max_s", backlog_max_s),
        ("idle_requests", idle_requests),
        ("idle_s", idle_s),
    ):
        if value is not None:
            changes[name] = value
    if device in ("cuda", "sim"):  # a device that wants hundreds of texts a batch
        changes["raw_budgets"] = (4096,) if quick else (2048, 4096, 8192, 16384)
        if requests is None and not quick:
            changes["requests"] = ACCELERATOR_REQUESTS
        if backlog_requests is None and not quick:
            changes["backlog_requests"] = ACCELERATOR_BACKLOG
    if device == "cuda":
        changes["st_sizes"] = (32,) if quick else (32, 128, 512)
    return dataclasses.replace(config, **changes)  # type: ignore[arg-type]


def run_modes(
    config: BenchConfig, settings: Settings, bootstrap: str | None, *, keep_broker: bool
) -> None:
    """Run the modes (on the local broker unless ``bootstrap``), write the report into
    ``config.out`` and print its Markdown (the files written on stderr)."""
    from pipeline.tools.bench import run_bench, write_report

    with local_broker_unless(bootstrap, settings, keep=keep_broker) as address:
        report = run_bench(config, settings, address)
    paths = write_report(report, config.out)
    click.echo((config.out / "bench.md").read_text(encoding="utf-8"))
    for kind, path in paths.items():
        click.echo(f"{kind}: {path}", err=True)
    sys.stdout.flush()


def run_soak(
    settings: Settings,
    bootstrap: str | None,
    duration_s: float,
    *,
    out: Path,
    rate: float,
    loads: tuple[float, ...],
    requests: int | None,
    dup_rate: float | None,
    seed: int,
    device: str | None,
    worker_env: tuple[tuple[str, str], ...],
) -> None:
    """``--soak``: run :mod:`pipeline.tools.bench.soak` (``loads``' first fraction the
    share of the base rate, ``requests`` the calibration burst, ``dup_rate`` None: the
    soak's own) and print its headline."""
    from pipeline.tools.bench.soak import SoakConfig, write_soak
    from pipeline.tools.bench.soak import run_soak as soak

    config = SoakConfig(duration_s=duration_s, out=out, rate=rate, seed=seed, device=device,
                        worker_env=worker_env)  # fmt: skip
    if loads:
        config = dataclasses.replace(config, load=loads[0])
    if requests is not None:
        config = dataclasses.replace(config, calibrate_requests=requests)
    if dup_rate is not None:
        config = dataclasses.replace(config, dup_rate=dup_rate)
    report = soak(config, settings, bootstrap)
    paths = write_soak(report, out)
    click.echo(json.dumps(report["summary"] | {"repeated_answers": report["repeated_answers"]},
                          indent=1))  # fmt: skip
    for kind, path in paths.items():
        click.echo(f"{kind}: {path}", err=True)
