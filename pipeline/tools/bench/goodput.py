"""Realtime goodput: requests answered within their deadline, as a share of what was possible.

Pure arithmetic over a run's report (issue 31; Nexus, Clockwork and Orloj
measure deadline-aware serving the same way)::

    C       = raw's best throughput (texts/s) x (deadline - trip - answer) / 1000
    goodput = realtime answered within its deadline / min(realtime sent, C)

``C`` bounds how many realtime requests the model alone could finish inside
one deadline from a standing start: the deadline less the legs no scheduler
can spend on the model (the realtime results' p50 trip into the worker,
``engine`` in :func:`pipeline.tools.bench.stats.path_breakdown`, and answer back),
at the best rate the model reaches alone in the same run. A burst sends all
of its requests at once, so their deadlines end together and no more than
``C`` of them can make it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["FORMULA", "GOODPUT_PHASES", "capacity_bound", "goodput", "realtime_goodput"]

#: The adaptive phases whose realtime goodput the report states.
GOODPUT_PHASES = ("saturate", "burst", "burst-small")

FORMULA = (
    "realtime goodput = realtime answered within its deadline / min(realtime sent, C), "
    "C = raw's best texts/s x (realtime deadline − p50 of the realtime trip and answer legs) / 1000"
)


def capacity_bound(best_per_s: float, deadline_ms: float, legs_ms: float) -> float:
    """``C``: texts the model alone finishes within ``deadline_ms`` less ``legs_ms``
    at ``best_per_s`` (0 when the legs alone spend the deadline)."""
    return best_per_s * max(deadline_ms - legs_ms, 0.0) / 1000.0


def goodput(on_time: int, sent: int, capacity: float) -> float | None:
    """``on_time / min(sent, capacity)``; ``None`` when nothing was possible (no
    realtime sent, or no capacity)."""
    possible = min(float(sent), capacity)
    return on_time / possible if possible > 0 else None


def realtime_goodput(phase: Mapping[str, Any], best_per_s: float | None) -> dict[str, Any] | None:
    """The goodput block of one phase summary (see the module's formula), or ``None``
    when the phase lacks what it needs (raw not run, no realtime result computed)."""
    if best_per_s is None or not phase.get("sent_by_lane") or not phase.get("deadlines_ms"):
        return None
    legs = phase.get("realtime_path_ms") or {}
    trip = (legs.get("engine") or {}).get("p50")
    answer = (legs.get("answer") or {}).get("p50")
    if trip is None or answer is None:
        return None
    deadline = float(phase["deadlines_ms"]["realtime"])
    sent = int(phase["sent_by_lane"].get("realtime", 0))
    on_time = int((phase.get("on_time") or {}).get("realtime", 0))
    capacity = capacity_bound(best_per_s, deadline, trip + answer)
    return {
        "on_time": on_time,
        "sent": sent,
        "capacity": capacity,
        "deadline_ms": deadline,
        "legs_ms": trip + answer,
        "best_per_s": best_per_s,
        "goodput": goodput(on_time, sent, capacity),
    }
