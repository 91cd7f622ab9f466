"""The soak's arithmetic and plot: pure functions over the samples :mod:`.soak` took.

- :func:`slope_per_hour`: the least-squares slope of a series, in units per hour;
- :func:`per_minute`: realtime p99 (and counts) per minute of the run;
- :func:`window_p99`: the p99 of the latencies received in one window;
- :func:`repeats_by_event`: the answers repeated (a request id answered more than
  once) in each stretch that starts at an event;
- :func:`warmup_at_store_bound`: where the warm-up ends, from the dedupe store's
  memory bound, not from the RSS it is meant to judge;
- :func:`held_partitions`: the partitions a worker's log says it held for want of a
  start offset, and when;
- :func:`summarise`: the report's headline figures and the targets they meet
  (:func:`memory_summary` and :func:`latency_summary`);
- :func:`plot`: ``soak.png``, the timeline of every reading with the events marked.

``python -m pipeline.tools.bench.soak_report SOAK_JSON`` recomputes a written
report's memory figures from its samples (and its plot), e.g. for a run taken
before the warm-up rule.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.tools.bench.stats import percentile

__all__ = [
    "MIB",
    "MIN_AFTER_WARMUP_S",
    "P99_DRIFT_TARGET",
    "RSS_SLOPE_TARGET_MIB_H",
    "held_partitions",
    "latency_summary",
    "memory_summary",
    "per_minute",
    "plot",
    "repeats_by_event",
    "slope_per_hour",
    "store_bound_bytes",
    "summarise",
    "warmup_at_store_bound",
    "window_p99",
]

MIB = 1024 * 1024
#: The issue's targets: RSS slope after warm-up, and the last 5 minutes' realtime p99
#: over the first 5 minutes'.
RSS_SLOPE_TARGET_MIB_H = 20.0
P99_DRIFT_TARGET = 1.2
#: A slope counts against its target only over at least this long after the warm-up.
MIN_AFTER_WARMUP_S = 1200.0
#: The warm-up the first soaks used (a sixth of the run, at most this), reported beside
#: the store-bound one for comparison.
FIXED_WARMUP_S = 300.0

WARMUP_RULE = (
    "the first sample at which the first worker's RocksDB folder holds as many bytes as "
    "its dedupe stores' memory bound (partitions x PIPELINE_DEDUPE_STORE_MEMORY_MIB): "
    "before it their memtables and block caches may still be filling"
)


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float | None:
    """The least-squares slope of ``(t_s, value)`` points, in value units per hour;
    None for fewer than two points or a single instant."""
    if len(points) < 2:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 3600.0


def window_p99(latencies: Sequence[tuple[float, float]], lo_s: float, hi_s: float) -> float | None:
    """The p99 of the ``(received_s, latency_ms)`` latencies with lo_s <= received_s < hi_s."""
    return percentile([ms for t, ms in latencies if lo_s <= t < hi_s], 99)


def per_minute(
    latencies: Sequence[tuple[float, float]],
    expired_s: Sequence[float],
    duration_s: float,
    bucket_s: float = 60.0,
) -> list[dict[str, Any]]:
    """One row per ``bucket_s`` of ``[0, duration_s)``: its start, the realtime results
    received in it, their p99 (ms) and the realtime requests that expired in it."""
    rows = []
    start = 0.0
    while start < duration_s:
        end = start + bucket_s
        inside = [ms for t, ms in latencies if start <= t < end]
        rows.append(
            {
                "t_s": start,
                "n": len(inside),
                "p99_ms": percentile(inside, 99),
                "expired": sum(1 for t in expired_s if start <= t < end),
            }
        )
        start = end
    return rows


#: A worker's log line (text format) saying it holds a partition: its time, the partition.
_HELD = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\].*?"
    r"(\S+\[\d+\]): start offset unknown .*holding the partition"
)


def held_partitions(lines: Sequence[str], t0_ms: float) -> list[dict[str, Any]]:
    """Per partition a worker's log (text format, local time) says it held for want of
    its start offset: how many lookups failed, the first and the last failure's time
    (seconds after ``t0_ms``, epoch ms). Repeats its log filter held back are not
    counted; each partition's span is what tells how long it was held."""
    seen: dict[str, dict[str, Any]] = {}
    for line in lines:
        match = _HELD.match(line)
        if match is None:
            continue
        stamp, millis, partition = match.groups()
        at = dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp() + int(millis) / 1000
        t_s = round(at - t0_ms / 1000.0, 1)
        row = seen.setdefault(partition, {"partition": partition, "failures": 0, "first_s": t_s})
        row["failures"] += 1
        row["last_s"] = t_s
    return list(seen.values())


def repeats_by_event(
    repeats_s: Sequence[float], events: Sequence[Mapping[str, Any]], end_s: float
) -> list[dict[str, Any]]:
    """The repeated answers received in each stretch from one event's start to the
    next event's (the last one to ``end_s``), and those before the first event."""
    marks = sorted((float(e["t_s"]), str(e["event"])) for e in events)
    bounds = [(0.0, "before any event"), *marks]
    out = []
    for i, (start, name) in enumerate(bounds):
        stop = bounds[i + 1][0] if i + 1 < len(bounds) else math.inf
        count = sum(1 for t in repeats_s if start <= t < stop)
        out.append({"event": name, "from_s": start, "to_s": min(stop, end_s), "repeated": count})
    return out


def store_bound_bytes(memory_mib: int, partitions: int) -> int:
    """What a worker's dedupe stores may hold in memory at most: ``memory_mib`` MiB
    (``PIPELINE_DEDUPE_STORE_MEMORY_MIB``) for each of ``partitions``."""
    return memory_mib * MIB * partitions


def warmup_at_store_bound(rows: Sequence[Mapping[str, Any]], bound_bytes: int) -> float | None:
    """The first sample's ``t_s`` whose ``rocksdb_bytes`` reach ``bound_bytes``; None when
    none does. Until the stores have written as many bytes as their memory bound, their
    memtables and block caches may still be filling (a memtable's entries are also in the
    write-ahead log, a cached block is a block of a file), so RSS may still grow; after it
    they can be full, and growth would be something else."""
    for row in rows:
        if (row.get("rocksdb_bytes") or 0) >= bound_bytes:
            return float(row["t_s"])
    return None


def _slope_after(rows: Sequence[Mapping[str, Any]], key: str, from_s: float) -> float | None:
    return slope_per_hour(
        [(r["t_s"], r[key] / MIB) for r in rows if r.get(key) is not None and r["t_s"] >= from_s]
    )


def memory_summary(
    rows: Sequence[Mapping[str, Any]],
    *,
    bound_bytes: int,
    duration_s: float,
    new_texts: float = 0.0,
) -> dict[str, Any]:
    """The worker's RSS against its target: the warm-up ends at the store bound
    (:func:`warmup_at_store_bound`), the slope after it counts when at least
    :data:`MIN_AFTER_WARMUP_S` of the run follow; beside it the slope after the fixed
    warm-up of the first soaks and over the last 10 minutes, RSS at the marks, and the
    store's bytes on disk per new text (``new_texts``: how many were sent)."""
    warmup = warmup_at_store_bound(rows, bound_bytes)
    after = None if warmup is None else max(duration_s - warmup, 0.0)
    slope = None if warmup is None else _slope_after(rows, "rss_bytes", warmup)
    rss = [(r["t_s"], r["rss_bytes"] / MIB) for r in rows if r.get("rss_bytes") is not None]
    at_warmup = next((v for t, v in rss if warmup is not None and t >= warmup), None)
    disk = rows[-1].get("rocksdb_bytes") if rows else None
    return {
        "store_bound_mib": bound_bytes / MIB,
        "warmup_rule": WARMUP_RULE,
        "warmup_s": warmup,
        "after_warmup_s": after,
        "rss_slope_mib_per_hour": slope,
        "rss_slope_target_mib_per_hour": RSS_SLOPE_TARGET_MIB_H,
        "rss_slope_min_after_warmup_s": MIN_AFTER_WARMUP_S,
        "rss_slope_met": slope is not None
        and after is not None
        and after >= MIN_AFTER_WARMUP_S
        and slope <= RSS_SLOPE_TARGET_MIB_H,
        "rss_slope_after_fixed_warmup_mib_per_hour": _slope_after(
            rows, "rss_bytes", min(FIXED_WARMUP_S, duration_s / 6.0)
        ),
        "rss_slope_last_10min_mib_per_hour": _slope_after(
            rows, "rss_bytes", max(duration_s - 600.0, 0.0)
        ),
        "rss_mib": {
            "first": rss[0][1] if rss else None,
            "at_warmup": at_warmup,
            "last": rss[-1][1] if rss else None,
            "max": max((v for _, v in rss), default=None),
        },
        "model_rss_slope_mib_per_hour": None
        if warmup is None
        else _slope_after(rows, "model_rss_bytes", warmup),
        "rocksdb_bytes_per_new_text": disk / new_texts if disk and new_texts else None,
    }


def latency_summary(
    latencies: Sequence[tuple[float, float]], *, duration_s: float, window_s: float = 300.0
) -> dict[str, Any]:
    """Realtime p99 of the first and last ``window_s`` (shortened to a sixth of a short
    run), their ratio, and whether it meets its target."""
    window_s = min(window_s, duration_s / 6.0)
    first = window_p99(latencies, 0.0, window_s)
    last = window_p99(latencies, duration_s - window_s, duration_s)
    ratio = last / first if first and last is not None else None
    return {
        "p99_window_s": window_s,
        "realtime_p99_first_ms": first,
        "realtime_p99_last_ms": last,
        "realtime_p99_ratio": ratio,
        "realtime_p99_ratio_target": P99_DRIFT_TARGET,
        "realtime_p99_flat": ratio is not None and ratio <= P99_DRIFT_TARGET,
    }


def summarise(
    rows: Sequence[Mapping[str, Any]],
    latencies: Sequence[tuple[float, float]],
    *,
    bound_bytes: int,
    duration_s: float,
    new_texts: float = 0.0,
) -> dict[str, Any]:
    """The headline: :func:`memory_summary` of the samples ``rows`` and
    :func:`latency_summary` of the realtime ``(received_s, latency_ms)``."""
    return {
        **memory_summary(rows, bound_bytes=bound_bytes, duration_s=duration_s,
                         new_texts=new_texts),
        **latency_summary(latencies, duration_s=duration_s),
    }  # fmt: skip


def plot(report: Mapping[str, Any], out: Path) -> Path:
    """Write ``soak.png`` into ``out``: RSS (worker and model process), open fds,
    RocksDB on disk, consumer lag and realtime p99 per minute, events as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["samples"]
    ts = [r["t_s"] / 60.0 for r in rows]

    def series(key: str, scale: float = 1.0) -> list[float]:
        return [r[key] / scale if r.get(key) is not None else float("nan") for r in rows]

    fig, axes = plt.subplots(5, 1, figsize=(8, 11), sharex=True)
    axes[0].plot(ts, series("rss_bytes", MIB), label="worker")
    axes[0].set_ylabel("worker RSS (MiB)")
    model = axes[0].twinx()  # a model process is several times the worker: its own scale
    model.plot(ts, series("model_rss_bytes", MIB), color="tab:orange", label="model process")
    model.set_ylabel("model process RSS (MiB)", color="tab:orange")
    first = next((r["rss_bytes"] for r in rows if r.get("rss_bytes") is not None), None)
    head = report["summary"]
    if first is not None and head.get("store_bound_mib"):
        axes[0].axhline(first / MIB + head["store_bound_mib"], color="tab:blue", linewidth=0.8,
                        linestyle=":", label="first sample + stores' bound")  # fmt: skip
    axes[0].legend(fontsize=8, loc="lower right")
    axes[1].plot(ts, series("open_fds"), color="tab:purple")
    axes[1].set_ylabel("open fds (worker)")
    axes[2].plot(ts, series("rocksdb_bytes", MIB), color="tab:brown")
    axes[2].set_ylabel("RocksDB on disk (MiB)")
    if head.get("store_bound_mib"):
        axes[2].axhline(head["store_bound_mib"], color="grey", linewidth=0.8, linestyle=":",
                        label="stores' memory bound")  # fmt: skip
        axes[2].legend(fontsize=8)
    if head.get("warmup_s") is not None:
        for ax in axes[:3]:
            ax.axvline(head["warmup_s"] / 60.0, color="black", linewidth=1.0)
        axes[0].annotate("warm-up ends (store bound on disk)", (head["warmup_s"] / 60.0, 0.02),
                         xycoords=("data", "axes fraction"), fontsize=7, rotation=90,
                         color="black")  # fmt: skip
    axes[3].plot(ts, series("lag"), color="tab:red")
    axes[3].set_ylabel("consumer lag (records)")
    minutes = report["per_minute"]
    axes[4].plot(
        [(m["t_s"] + 30.0) / 60.0 for m in minutes],
        [m["p99_ms"] if m["p99_ms"] is not None else float("nan") for m in minutes],
        marker="o",
        color="tab:green",
    )
    axes[4].axhline(200, color="grey", linewidth=0.8, linestyle=":", label="200 ms SLA")
    axes[4].set_ylabel("realtime p99 (ms)")
    axes[4].set_yscale("log")
    axes[4].legend(fontsize=8)
    for event in report["events"]:
        for ax in axes:
            ax.axvline(event["t_s"] / 60.0, color="grey", linewidth=0.8, linestyle="--")
        axes[0].annotate(event["event"], (event["t_s"] / 60.0, 1.0), xycoords=("data",
                         "axes fraction"), fontsize=7, rotation=90, va="top")  # fmt: skip
    axes[-1].set_xlabel("minutes since the soak's load started")
    slope = head["rss_slope_mib_per_hour"]
    title = f"Soak, {report['config']['duration_s']:.0f} s at {report['offered_rate']:.1f} req/s"
    if slope is not None:
        title += f": worker RSS slope {slope:.1f} MiB/h after warm-up"
    else:
        title += ": the stores never reached their bound (no slope)"
    axes[0].set_title(title, fontsize=10)
    fig.tight_layout()
    path = out / "soak.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def rereport(path: Path) -> dict[str, Any]:
    """Recompute ``path``'s (a ``soak.json``) memory figures from its samples, with the
    bound its workers ran with (its ``config.worker_env`` over the defaults), and
    rewrite it and its plot; the latency figures need every latency and stay."""
    from pipeline.settings import Settings

    report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    config = report["config"]
    settings = Settings.from_env(dict(config.get("worker_env") or ()))
    bound = store_bound_bytes(settings.dedupe.store_memory_mib, settings.topics.partitions)
    report["summary"].update(
        memory_summary(report["samples"], bound_bytes=bound, duration_s=config["duration_s"],
                       new_texts=report["sent"] * (1.0 - config["dup_rate"]))
    )  # fmt: skip
    path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    plot(report, path.parent)
    return report


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        head = rereport(Path(arg))["summary"]
        print(arg, json.dumps({k: v for k, v in head.items() if k != "warmup_rule"}, indent=1))
