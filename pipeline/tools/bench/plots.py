"""The benchmark's plots: latency against offered load, and the adaptive worker's
budget, batch size (and GPU utilisation, with ``--device cuda``) over time."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

__all__ = ["plots"]


def plots(report: dict[str, Any], out: Path) -> list[Path]:
    """Write ``latency_vs_load.png`` (when a mode ran a load phase) and
    ``adaptive_timeline.png`` (when the adaptive worker was sampled) into ``out``;
    return the paths written. A run without either draws no empty axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    loads = {
        mode: sorted(
            (p["offered_rate"], p["latency_ms"]["realtime"]["p99"], p["latency_ms"]["all"]["p99"])
            for p in data["phases"]
            if p.get("offered_rate") and p.get("latency_ms")
        )
        for mode, data in report["modes"].items()
    }
    if any(loads.values()):
        written.append(_latency_vs_load(plt, loads, out))
    rows = report["modes"].get("adaptive", {}).get("timeline", [])
    if len(rows) >= 2:
        written.append(_timeline(plt, rows, out))
    return written


def _latency_vs_load(
    plt: Any, loads: dict[str, list[tuple[float, float, float]]], out: Path
) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode, points in loads.items():
        if not points:
            continue
        xs = [x for x, _, _ in points]
        ax.plot(xs, [r for _, r, _ in points], marker="o", label=f"{mode}: realtime p99")
        ax.plot(xs, [a for _, _, a in points], marker="x", linestyle="--", label=f"{mode}: all p99")
    ax.axhline(200, color="grey", linewidth=0.8, linestyle=":", label="200 ms SLA")
    ax.set_xlabel("offered load (requests/s, open loop)")
    ax.set_ylabel("latency p99 (ms, created → received)")
    ax.set_yscale("log")
    ax.set_title("Latency vs offered load")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "latency_vs_load.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _timeline(plt: Any, rows: list[dict[str, Any]], out: Path) -> Path:
    with_gpu = any(row.get("gpu") is not None for row in rows)  # --device cuda
    fig, axes = plt.subplots(3 if with_gpu else 2, 1, figsize=(7, 7 if with_gpu else 5),
                             sharex=True)  # fmt: skip
    top, bottom = axes[0], axes[1]
    ts, sizes, budgets, gpu = [], [], [], []
    for prev, row in itertools.pairwise(rows):
        dn = row["batches"] - prev["batches"]
        ts.append(row["t_s"])
        budgets.append(row["budget"])
        sizes.append((row["items"] - prev["items"]) / dn if dn > 0 else float("nan"))
        reading = row.get("gpu")
        gpu.append(100 * reading if reading is not None else float("nan"))
    top.plot(ts, budgets, color="tab:blue")
    top.set_ylabel("token budget")
    bottom.plot(ts, sizes, color="tab:orange", marker=".", linestyle="none")
    bottom.set_ylabel("mean batch size")
    if with_gpu:
        axes[2].plot(ts, gpu, color="tab:green")
        axes[2].set_ylabel("GPU utilisation (%)")
        axes[2].set_ylim(0, 105)
    axes[-1].set_xlabel("seconds since the adaptive worker was ready")
    top.set_title("Adaptive: budget and batch size over time")
    fig.tight_layout()
    path = out / "adaptive_timeline.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
