"""The soak's arithmetic and plot: pure functions over the samples :mod:`.soak` took.

- :func:`slope_per_hour`: the least-squares slope of a series, in units per hour;
- :func:`per_minute`: realtime p99 (and counts) per minute of the run;
- :func:`window_p99`: the p99 of the latencies received in one window;
- :func:`repeats_by_event`: the answers repeated (a request id answered more than
  once) in each stretch that starts at an event;
- :func:`summarise`: the report's headline figures and the targets they meet;
- :func:`plot`: ``soak.png``, the timeline of every reading with the events marked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.tools.bench.stats import percentile

__all__ = [
    "MIB",
    "P99_DRIFT_TARGET",
    "RSS_SLOPE_TARGET_MIB_H",
    "per_minute",
    "plot",
    "repeats_by_event",
    "slope_per_hour",
    "summarise",
    "window_p99",
]

MIB = 1024 * 1024
#: The issue's targets: RSS slope after warm-up, and the last 5 minutes' realtime p99
#: over the first 5 minutes'.
RSS_SLOPE_TARGET_MIB_H = 20.0
P99_DRIFT_TARGET = 1.2


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


def summarise(
    rss: Sequence[tuple[float, float]],
    latencies: Sequence[tuple[float, float]],
    *,
    warmup_s: float,
    duration_s: float,
    window_s: float = 300.0,
) -> dict[str, Any]:
    """The headline: RSS slope after ``warmup_s`` (``rss`` in bytes), realtime p99 of
    the first and last ``window_s`` (shortened to a sixth of a short run), their
    ratio, and whether each meets its target."""
    window_s = min(window_s, duration_s / 6.0)
    slope = slope_per_hour([(t, b / MIB) for t, b in rss if t >= warmup_s])
    first = window_p99(latencies, 0.0, window_s)
    last = window_p99(latencies, duration_s - window_s, duration_s)
    ratio = last / first if first and last is not None else None
    return {
        "warmup_s": warmup_s,
        "rss_slope_mib_per_hour": slope,
        "rss_slope_target_mib_per_hour": RSS_SLOPE_TARGET_MIB_H,
        "rss_slope_met": slope is not None and slope <= RSS_SLOPE_TARGET_MIB_H,
        "p99_window_s": window_s,
        "realtime_p99_first_ms": first,
        "realtime_p99_last_ms": last,
        "realtime_p99_ratio": ratio,
        "realtime_p99_ratio_target": P99_DRIFT_TARGET,
        "realtime_p99_flat": ratio is not None and ratio <= P99_DRIFT_TARGET,
    }


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
    axes[0].plot(ts, series("model_rss_bytes", MIB), label="model process")
    axes[0].set_ylabel("RSS (MiB)")
    axes[0].legend(fontsize=8)
    axes[1].plot(ts, series("open_fds"), color="tab:purple")
    axes[1].set_ylabel("open fds (worker)")
    axes[2].plot(ts, series("rocksdb_bytes", MIB), color="tab:brown")
    axes[2].set_ylabel("RocksDB on disk (MiB)")
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
    head = report["summary"]
    slope = head["rss_slope_mib_per_hour"]
    title = f"Soak, {report['config']['duration_s']:.0f} s at {report['offered_rate']:.1f} req/s"
    if slope is not None:
        title += f": worker RSS slope {slope:.1f} MiB/h after warm-up"
    axes[0].set_title(title, fontsize=10)
    fig.tight_layout()
    path = out / "soak.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
