"""The benchmark's report: a Markdown table, JSON and PNG plots.

:func:`markdown` renders the per-phase table, the feed, goodput, fleet and path
tables, and the targets :mod:`.targets` judges; :func:`write_report` writes
``bench.json``, ``bench.md`` and the plots of :mod:`.plots` into a folder.
``targets`` and ``goodputs`` are importable from here too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.tools.bench.feed import feed, feed_lines
from pipeline.tools.bench.fleets import fleet_rows
from pipeline.tools.bench.goodput import FORMULA
from pipeline.tools.bench.plots import plots
from pipeline.tools.bench.stats import PATH_LEGS
from pipeline.tools.bench.targets import goodputs, phase_of, ratio, targets

__all__ = ["goodputs", "markdown", "targets", "write_report"]


def _goodput_lines(report: dict[str, Any]) -> list[str]:
    good = goodputs(report)
    if not good:
        return []
    lines = [f"Realtime goodput (adaptive): {FORMULA}.", "",
             "| phase | realtime sent | on time | C | deadline − legs ms | goodput |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for name, g in good.items():
        lines.append(
            f"| {name} | {g['sent']} | {g['on_time']} | {g['capacity']:.1f} "
            f"| {g['deadline_ms']:.0f} − {g['legs_ms']:.0f} | {_fmt(g['goodput'], 2)} |"
        )
    return [*lines, ""]


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _rows(report: dict[str, Any]) -> list[str]:
    rows = []
    for mode, data in report["modes"].items():
        for p in data["phases"]:
            lat = p.get("latency_ms") or {}
            rt, std, bulk = lat.get("realtime", {}), lat.get("standard", {}), lat.get("bulk", {})
            served = p.get("served") or {}
            dedupe = "/".join(str(served.get(k, 0)) for k in ("batch", "inflight", "stored"))
            missed = (
                sum((p.get("deadline_missed") or {}).values()) if "deadline_missed" in p else None
            )
            expired = sum((p.get("expired") or {}).values()) if "expired" in p else None
            rss, model_rss = p.get("peak_rss_bytes"), p.get("model_peak_rss_bytes")
            model_cpu = p.get("model_cpu_util")
            busy = p.get("gpu_util") if p.get("gpu_util") is not None else p.get("device_busy")
            rows.append(
                "| "
                + " | ".join(
                    [
                        mode,
                        p["phase"],
                        _fmt(p.get("offered_rate"), 1),
                        f"{p.get('answered', 0)}/{p.get('sent', 0)}",
                        _fmt(p.get("throughput"), 1),
                        f"{_fmt(rt.get('p50'))} / {_fmt(rt.get('p95'))} / {_fmt(rt.get('p99'))}",
                        f"{_fmt(std.get('p50'))} / {_fmt(std.get('p99'))}",
                        f"{_fmt(bulk.get('p50'))} / {_fmt(bulk.get('p99'))}",
                        _fmt(missed),
                        _fmt(expired),
                        _fmt(p.get("mean_batch_size"), 1),
                        _fmt(p.get("mean_batch_tokens")),
                        _fmt(p.get("padding_ratio"), 2),
                        _fmt(p.get("tokenize_share"), 3),
                        dedupe if "served" in p else "–",
                        _fmt(p.get("cpu_util"), 2)
                        + (f" + {model_cpu:.2f}" if model_cpu is not None else ""),
                        _fmt(rss / 2**20 if rss else None)
                        + (f" + {model_rss / 2**20:.0f}" if model_rss else ""),
                        _fmt(busy, 2),
                    ]
                )
                + " |"
            )
    return rows


def _backlog_line(p: dict[str, Any]) -> str:
    """How the backlog phase went: how long the bulk took and what realtime rode along."""
    drain = p.get("drain_s")
    drained = (f"drained in {drain:.1f} s" if p.get("drained") and drain is not None
               else f"was not drained when the realtime stream ended ({p['backlog_max_s']:g} s "
               "at most)")  # fmt: skip
    realtime = p["sent"] - p["backlog_requests"]
    return (
        f"Backlog (adaptive): {p['backlog_requests']:,} bulk requests at once into the idle "
        f"worker {drained}; {realtime} realtime requests sent at {p['realtime_rate']:g}/s "
        "meanwhile."
    )


def _threads_table(rows: list[dict[str, Any]]) -> list[str]:
    """The thread-budget sweep: texts/s per setting, and each against the first setting."""
    lines = [
        "| threads T:K[:H] | torch / tokenizer threads | raw serial /s | raw pipelined /s "
        "| adaptive /s | vs first | adaptive CPU (cores) | adaptive /core-s | vs first "
        "| realtime p99 ms |",
        "|" + "---|" * 10,
    ]
    first = rows[0]["adaptive"] if rows else None
    first_per_core = rows[0].get("adaptive_per_core") if rows else None
    for r in rows:
        per_core = r.get("adaptive_per_core")
        raw = r["raw"]
        lines.append(
            f"| {r['setting']} | {raw['torch_threads']} / {raw['tokenizer_threads']} "
            f"| {_fmt(raw['serial'], 1)} | {_fmt(raw['pipelined'], 1)} "
            f"| {_fmt(r['adaptive'], 1)} | {_fmt(ratio(r['adaptive'], first), 2)} "
            f"| {_fmt(r['adaptive_cpu'], 2)} | {_fmt(per_core, 1)} "
            f"| {_fmt(ratio(per_core, first_per_core), 2)} "
            f"| {_fmt(r['adaptive_realtime_p99_ms'])} |"
        )
    return lines


def _path_table(report: dict[str, Any]) -> list[str]:
    """Where computed realtime requests spent their time, per worker mode and phase."""
    lines = [
        "Where realtime time goes (computed realtime results; p50 / p99 ms; engine = the trip "
        "into the worker plus the wait behind batches already in the engine):",
        "",
        "| mode | phase | n | " + " | ".join(PATH_LEGS) + " |",
        "|" + "---|" * (3 + len(PATH_LEGS)),
    ]
    for mode, data in report["modes"].items():
        for p in data["phases"]:
            legs = p.get("realtime_path_ms") or {}
            n = (legs.get("queue") or {}).get("n")
            if not n:
                continue
            cells = [f"{_fmt(legs[g]['p50'])} / {_fmt(legs[g]['p99'])}" for g in PATH_LEGS]
            lines.append(f"| {mode} | {p['phase']} | {int(n)} | " + " | ".join(cells) + " |")
    return lines if len(lines) > 4 else []


def markdown(report: dict[str, Any]) -> str:
    """The per-phase table and the targets, in Markdown (and the thread sweep, if run)."""
    head = (
        "| mode | phase | offered/s | answered | throughput/s | realtime p50/p95/p99 ms "
        "| standard p50/p99 ms | bulk p50/p99 ms | missed | expired | batch | tokens/batch "
        "| padding | tokenize | dedupe b/i/s | CPU (cores, worker + model) "
        "| peak RSS MiB (worker + model) "
        "| device busy |"
    )
    lines = [head, "|" + "---|" * 18, *_rows(report), ""]
    workers = (report.get("config") or {}).get("workers") or 1
    if workers > 1:
        lines += [f"Each worker mode ran {workers} worker processes side by side (one consumer "
                  "group); throughput is theirs together.", ""]  # fmt: skip
    worker_env = (report.get("config") or {}).get("worker_env") or []
    if worker_env:
        lines += ["Every pipeline worker ran with " + ", ".join(f"`{k}={v}`" for k, v in worker_env)
                  + " (--set).", ""]  # fmt: skip
    idle = phase_of(report, "noop", "after-idle")
    if idle is not None and idle.get("latencies_ms"):
        lines += [f"After idle (noop, {idle['idle_s']:g} s of silence before each request), "
                  "creation → result, ms: " + ", ".join(f"{v:.0f}" for v in idle["latencies_ms"]),
                  ""]  # fmt: skip
    backlog = phase_of(report, "adaptive", "backlog")
    if backlog is not None:
        lines += [_backlog_line(backlog), ""]
    lines += feed_lines(report)
    lines += _goodput_lines(report)
    lines += fleet_rows(report)
    path = _path_table(report)
    if path:
        lines += [*path, ""]
    lines += ["| target | measured | goal | met |", "|---|---|---|---|"]
    for t in targets(report):
        sign = "≤" if t["at_most"] else "≥"
        met = {True: "yes", False: "**no**", None: "not run"}[t["met"]]
        goal = "–" if t["goal"] is None else f"{sign} {t['goal']:g} {t['unit']}"
        if t["goal"] is None and t["value"] is not None:
            met = "reported"
        value = _fmt(t["value"], 2)
        lines.append(f"| {t['target']} | {value} {t['unit']} | {goal} | {met} |")
    if report.get("threads"):
        lines += ["", *_threads_table(report["threads"])]
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], out: Path) -> dict[str, Path]:
    """Write the JSON, Markdown and PNG files into ``out``; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    report = {**report, "feed": feed(report), "goodput": goodputs(report),
              "targets": targets(report)}  # fmt: skip
    paths = {"json": out / "bench.json", "markdown": out / "bench.md"}
    paths["json"].write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    paths["markdown"].write_text(markdown(report), encoding="utf-8")
    for p in plots(report, out):
        paths[p.stem] = p
    return paths
