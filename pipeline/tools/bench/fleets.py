"""The ``fleets`` comparison: one fleet of N mixed workers against the same N split
into a realtime fleet and a batch fleet, on the backlog scenario.

Both layouts run the adaptive worker's defaults on fresh topics: ``mixed``
is ``workers`` workers in one consumer group consuming every lane; ``split``
gives ``fleet_realtime_workers`` of them ``PIPELINE_WORKER_LANES=realtime``
and a consumer group of their own, and the rest ``standard,bulk`` in another
(README, "One fleet or two"). Each then takes the backlog phase
(:func:`pipeline.tools.bench.phases.backlog`): a bulk backlog at once, realtime at a
slow steady rate while it drains. The report sets realtime p50/p99 and
expirations beside the bulk's drain time and throughput, layout by layout.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from pipeline.kafka.security import security_env
from pipeline.settings import Settings
from pipeline.tools.bench.modes import Deployment, mode_env
from pipeline.tools.bench.phases import Sampler, backlog, say

if TYPE_CHECKING:
    from pipeline.tools.bench.run import BenchConfig

__all__ = ["LAYOUTS", "fleet_rows", "run_fleets", "split_env"]

LAYOUTS = ("mixed", "split")


def split_env(workers: int, realtime_workers: int, app_id: str) -> list[dict[str, str]]:
    """Per-worker settings of the split layout: the first ``realtime_workers`` a
    realtime fleet, the rest a batch fleet, each fleet its own consumer group."""
    if not 1 <= realtime_workers < workers:
        raise ValueError(
            f"a split of {workers} workers needs 1..{workers - 1} realtime workers, "
            f"not {realtime_workers}"
        )
    realtime = {"PIPELINE_WORKER_LANES": "realtime", "PIPELINE_WORKER_APP_ID": f"{app_id}-rt"}
    batch = {"PIPELINE_WORKER_LANES": "standard,bulk", "PIPELINE_WORKER_APP_ID": f"{app_id}-batch"}
    return [realtime if i < realtime_workers else batch for i in range(workers)]


def run_fleets(
    config: BenchConfig, bootstrap: str, settings: Settings, model_env: dict[str, str]
) -> dict[str, Any]:
    """Both layouts, one after the other, on the backlog scenario."""
    workers = max(config.workers, 2)
    extra = mode_env("adaptive", fixed_batch=config.fixed_batch,
                     fixed_wait_ms=config.fixed_wait_ms,
                     max_length=settings.model.max_length)  # fmt: skip
    extra |= model_env
    extra.update(config.worker_env)
    env = {**extra, **security_env(settings)}
    phases = []
    for layout in LAYOUTS:
        per_worker: list[dict[str, str]] = []
        if layout == "split":
            app_id = f"pipeline-bench-fleets-{uuid.uuid4().hex[:8]}"
            per_worker = split_env(workers, config.fleet_realtime_workers, app_id)
        dep = Deployment(f"fleets-{layout}", bootstrap=bootstrap, out=config.out,
                         extra_env=env, workers=workers, per_worker=per_worker,
                         keep_topics=config.keep_topics)  # fmt: skip
        say(f"fleets/{layout}: starting {workers} worker(s)")
        sampler = None
        try:
            dep.start()
            sampler = Sampler(dep.metrics_port)
            summary = backlog(dep, config=config, seed=config.seed + 40, sampler=sampler)
        finally:
            if sampler is not None:
                sampler.close()
            dep.stop()
        summary |= {
            "phase": f"backlog-{layout}",
            "layout": layout,
            "realtime_workers": (config.fleet_realtime_workers if layout == "split" else workers),
        }
        phases.append(summary)
    return {"mode": "fleets", "env": extra, "phases": phases, "timeline": []}


def fleet_rows(report: dict[str, Any]) -> list[str]:
    """The comparison as a Markdown table (none when the mode did not run)."""
    phases = (report["modes"].get("fleets") or {}).get("phases") or []
    if not phases:
        return []
    lines = [
        "Fleets (the backlog scenario; mixed: every worker consumes every lane, one "
        "consumer group; split: a realtime fleet and a standard+bulk fleet, a group each):",
        "",
        "| layout | workers (realtime fleet) | realtime p50 / p99 ms | realtime expired "
        "| bulk drained in s | bulk texts/s |",
        "|---|---|---|---|---|---|",
    ]
    for p in phases:
        rt = p["latency_ms"]["realtime"]
        drain = p.get("drain_s") if p.get("drained") else None
        rate = p["backlog_requests"] / drain if drain else None
        fleet = "" if p["layout"] == "mixed" else f" ({p['realtime_workers']})"
        lines.append(
            f"| {p['layout']} | {p['workers']}{fleet} | {_f(rt['p50'])} / {_f(rt['p99'])} "
            f"| {p['expired']['realtime']} | {_f(drain, 1)} | {_f(rate, 1)} |"
        )
    return [*lines, ""]


def _f(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:.{digits}f}"
