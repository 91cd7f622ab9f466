"""Report math and probes: percentiles, phase summaries, /proc readings, /metrics scrapes.

Everything here is pure except :class:`ProcProbe` (reads ``/proc/<pid>``) and
:func:`scrape` (one HTTP GET); both return ``None`` instead of raising.
"""

from __future__ import annotations

import math
import os
import re
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.settings import LANES

__all__ = [
    "PATH_LEGS",
    "Answered",
    "ProcProbe",
    "last_answer_s",
    "metric_total",
    "model_stats",
    "parse_metrics",
    "path_breakdown",
    "percentile",
    "scrape",
    "summarize",
]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks
    (numpy's default); ``None`` for no values."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError("q must be in [0, 100]")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Answered:
    """One answer as the bench consumer saw it."""

    request_id: str
    lane: str
    kind: str  # result | dead_letter
    created_at_ms: int
    received_ms: float
    completed_at_ms: int | None = None
    served: str | None = None
    stage: str | None = None
    queue_ms: float | None = None  # worker arrival -> its batch handed to the engine
    inference_ms: float | None = None  # its batch's model call
    failed_at_ms: int | None = None  # a dead letter's: when the worker decided it


def _latency_block(latencies: Sequence[float]) -> dict[str, float | None]:
    return {
        "n": float(len(latencies)),
        "p50": percentile(latencies, 50),
        "p95": percentile(latencies, 95),
        "p99": percentile(latencies, 99),
        "max": max(latencies) if latencies else None,
    }


def summarize(
    answers: Iterable[Answered],
    *,
    sent: int,
    started_ms: float,
    deadlines_ms: Mapping[str, int],
) -> dict[str, Any]:
    """Throughput, latency percentiles per lane, deadline misses, results on time,
    expirations (and how long after its creation each ``expired`` dead letter came
    back, and when the worker decided it: the letter's ``failed_at_ms``) and dedupe
    levels of one phase. Latency is receipt time minus ``created_at_ms``; throughput
    is answers over (last receipt - ``started_ms``)."""
    answers = list(answers)
    results = [a for a in answers if a.kind == "result"]
    dead = [a for a in answers if a.kind == "dead_letter"]
    last = max((a.received_ms for a in answers), default=started_ms)
    elapsed_s = max(last - started_ms, 1e-3) / 1000.0
    latency: dict[str, Any] = {}
    for lane in (*LANES, "all"):
        chosen = [a for a in results if lane in ("all", a.lane)]
        latency[lane] = _latency_block([a.received_ms - a.created_at_ms for a in chosen])
    missed = dict.fromkeys(LANES, 0)
    on_time = dict.fromkeys(LANES, 0)
    for a in results:
        if a.lane not in missed:
            continue
        done = a.completed_at_ms if a.completed_at_ms is not None else a.received_ms
        if done - a.created_at_ms > deadlines_ms.get(a.lane, math.inf):
            missed[a.lane] += 1
        else:
            on_time[a.lane] += 1
    expired = dict.fromkeys(LANES, 0)
    expired_after: list[float] = []  # creation -> the expired dead letter's receipt
    expired_decided: list[float] = []  # creation -> the worker's decision (failed_at_ms)
    for a in dead:
        if a.stage == "expired" and a.lane in expired:
            expired[a.lane] += 1
            if a.lane == LANES[0]:
                expired_after.append(a.received_ms - a.created_at_ms)
                if a.failed_at_ms is not None:
                    expired_decided.append(a.failed_at_ms - a.created_at_ms)
    served: dict[str, int] = {}
    for a in results:
        key = a.served or "computed"
        served[key] = served.get(key, 0) + 1
    per_lane = {lane: sum(1 for a in answers if a.lane == lane) for lane in LANES}
    realtime = [a for a in results if a.lane == LANES[0]]
    return {
        "sent": sent,
        "answered": len(answers),
        "results": len(results),
        "dead_letters": len(dead),
        "unanswered": max(sent - len(answers), 0),
        "answered_by_lane": per_lane,
        "elapsed_s": elapsed_s,
        "throughput": len(answers) / elapsed_s,
        "latency_ms": latency,
        "realtime_path_ms": path_breakdown(realtime),
        "deadline_missed": missed,
        "on_time": on_time,
        "deadlines_ms": {lane: deadlines_ms[lane] for lane in LANES if lane in deadlines_ms},
        "expired": expired,
        "realtime_expired_after_ms": _latency_block(expired_after),
        "realtime_expired_decided_ms": _latency_block(expired_decided),
        "served": served,
        "dedupe_hit_rate": {
            level: served.get(level, 0) / len(results) if results else 0.0
            for level in ("batch", "inflight", "stored")
        },
    }


def last_answer_s(answers: Iterable[Answered], lane: str, started_ms: float) -> float | None:
    """Seconds from ``started_ms`` to the receipt of ``lane``'s last answer (result
    or dead letter): how long a backlog of that lane took to drain; ``None`` for none."""
    last = max((a.received_ms for a in answers if a.lane == lane), default=None)
    return None if last is None else (last - started_ms) / 1000.0


#: The legs of a computed answer's latency, in the order they happen.
PATH_LEGS = ("queue", "engine", "model", "answer")


def path_breakdown(results: Sequence[Answered]) -> dict[str, dict[str, float | None]]:
    """Where computed results spent their time, p50/p99 per leg (ms):

    - ``queue``: from reaching the worker to its batch being handed to the engine
      (the scheduler's wait);
    - ``model``: its batch's model call;
    - ``engine``: the rest of creation -> completion: the trip into the worker
      (producer, broker, fetch, intake) and the wait behind batches already in
      the engine, plus tokenising;
    - ``answer``: completion -> receipt (publish, broker, the reader's fetch).

    Only results computed by the model count (stored and deduplicated ones have
    no batch of their own)."""
    legs: dict[str, list[float]] = {leg: [] for leg in PATH_LEGS}
    for a in results:
        if a.served not in (None, "computed") or a.queue_ms is None or a.inference_ms is None:
            continue
        if a.completed_at_ms is None:
            continue
        total = a.completed_at_ms - a.created_at_ms
        legs["queue"].append(a.queue_ms)
        legs["model"].append(a.inference_ms)
        legs["engine"].append(max(total - a.queue_ms - a.inference_ms, 0.0))
        legs["answer"].append(a.received_ms - a.completed_at_ms)
    return {
        leg: {"n": float(len(v)), "p50": percentile(v, 50), "p99": percentile(v, 99)}
        for leg, v in legs.items()
    }


class ProcProbe:
    """CPU time and peak RSS of one process, from ``/proc/<pid>`` (Linux)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def cpu_s(self) -> float | None:
        """User + system CPU seconds so far (threads included)."""
        try:
            with open(f"/proc/{self.pid}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        # After the ")" of comm, field 3 (state) is index 0: utime is 14, stime 15.
        return (int(fields[11]) + int(fields[12])) / self._ticks

    def children(self) -> list[int]:
        """The process's child processes now (``/proc/<pid>/task/*/children``)."""
        pids: list[int] = []
        try:
            tasks = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return pids
        for task in tasks:
            try:
                with open(f"/proc/{self.pid}/task/{task}/children", encoding="ascii") as f:
                    pids += [int(p) for p in f.read().split()]
            except (OSError, ValueError):
                continue
        return pids

    def cmdline(self) -> str:
        """The process's command line, its arguments joined by spaces ("" when gone)."""
        try:
            with open(f"/proc/{self.pid}/cmdline", "rb") as f:
                return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            return ""

    def peak_rss_bytes(self) -> int | None:
        """VmHWM: the process's peak resident set size."""
        return self.status_bytes("VmHWM")

    def rss_bytes(self) -> int | None:
        """VmRSS: the process's resident set size now."""
        return self.status_bytes("VmRSS")

    def status_bytes(self, field: str) -> int | None:
        """A ``kB`` field of ``/proc/<pid>/status`` in bytes; None when the process is
        gone or the field is not there."""
        try:
            with open(f"/proc/{self.pid}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith(f"{field}:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError):
            return None
        return None


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_metrics(text: str) -> Samples:
    """Prometheus text format → ``{(name, labels): value}`` (comments skipped)."""
    out: Samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        labels = frozenset(_LABEL.findall(m.group(3) or ""))
        out[(m.group(1), labels)] = value
    return out


def metric_total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of every sample of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def scrape(port: int, timeout_s: float = 2.0) -> Samples | None:
    """GET http://127.0.0.1:PORT/metrics, parsed; ``None`` when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as r:
            return parse_metrics(r.read().decode("utf-8", "replace"))
    except OSError:
        return None


def model_stats(before: Samples | None, after: Samples | None) -> dict[str, float | None]:
    """The model side's forward seconds and, of them, interpreter-lock wait seconds
    between two scrapes (``pipeline_model_*_seconds_total``). The worker publishes
    both totals together every ``PIPELINE_METRICS_SAMPLE_INTERVAL_S`` (1 s in the
    bench): the phases take ``after`` one interval past their last answer."""
    if before is None or after is None:
        return {"model_forward_s": None, "model_lock_wait_s": None}

    def delta(name: str) -> float:
        return metric_total(after, name) - metric_total(before, name)

    return {
        "model_forward_s": delta("pipeline_model_forward_seconds_total"),
        "model_lock_wait_s": delta("pipeline_model_lock_wait_seconds_total"),
    }


def batch_stats(before: Samples | None, after: Samples | None) -> dict[str, float | None]:
    """Mean batch size, padded tokens, padding ratio and batches from two scrapes."""
    if before is None or after is None:
        return {"batches": None, "mean_batch_size": None, "mean_batch_tokens": None,
                "padding_ratio": None}  # fmt: skip

    def delta(name: str) -> float:
        return metric_total(after, name) - metric_total(before, name)

    batches = delta("pipeline_batch_size_count")
    real, padded = delta("pipeline_tokens_real_total"), delta("pipeline_tokens_padded_total")
    return {
        "batches": batches,
        "mean_batch_size": delta("pipeline_batch_size_sum") / batches if batches else None,
        "mean_batch_tokens": padded / batches if batches else None,
        "padding_ratio": 1 - real / padded if padded else None,
    }
