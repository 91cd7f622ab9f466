"""A scheduler on a fake clock, and one engine driving it: shared by the scheduling tests."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from pipeline.scheduling import Controller, Plan, Scheduler
from pipeline.settings import SchedulerSettings

__all__ = [
    "DEADLINE", "REALTIME", "SLO_MS", "Item", "Run", "cpu_ms", "drive", "item", "lanes_of",
    "scheduler", "settings",
]  # fmt: skip


@dataclasses.dataclass(frozen=True, eq=False)
class Item:
    """A request as the scheduler reads it (a :class:`~pipeline.scheduling.Queued`), named
    by ``payload``; the worker's is ``Work``."""

    payload: Any
    lane: str
    deadline_ms: int
    arrived_ms: int
    tokens: int


SLO_MS = 200  # the realtime lane's default deadline
DEADLINE = {"realtime": 200, "standard": 2000, "bulk": 60000}
REALTIME = frozenset({"realtime"})

Run = list[tuple[int, Plan[Item]]]


#: The worked examples' buckets (doubling, the default before the finer 13): their
#: arithmetic reads "16 rows of 32 tokens"; test_scheduling_properties draws others.
BUCKETS = "16,32,64,128,256"


def settings(**overrides: object) -> SchedulerSettings:
    overrides.setdefault("seq_buckets", BUCKETS)
    return dataclasses.replace(SchedulerSettings(), **overrides)  # type: ignore[arg-type]


def scheduler(expire: frozenset[str] = REALTIME, **overrides: Any) -> Scheduler[Item]:
    s = settings(**overrides)
    return Scheduler(s, expires=expire.__contains__, controller=Controller(s, slo_ms=SLO_MS))


def item(n: int, lane: str, *, tokens: int = 20, at: int = 0, deadline: int | None = None) -> Item:
    due = at + DEADLINE[lane] if deadline is None else deadline
    return Item(payload=n, lane=lane, deadline_ms=due, arrived_ms=at, tokens=tokens)


def cpu_ms(plan: Plan[Item]) -> float:
    """A 2-core CPU running MiniLM, roughly (docs/design.md): 12 ms + 0.2 ms per padded token."""
    return 12 + 0.2 * plan.padded_tokens


def drive(
    sched: Scheduler[Item],
    arrivals: list[Item],
    latency: Callable[[Plan[Item]], float] = cpu_ms,
    until: int | None = None,
    *,
    utilisation: float | None = None,
    max_steps: int = 100_000,
) -> Run:
    """Run one engine against the scheduler on a fake clock until all work is done.

    Stops at ``until`` when given; fails when the scheduler has not drained
    after ``max_steps`` steps (each step offers, waits or runs one batch).
    """
    arrivals = sorted(arrivals, key=lambda it: it.arrived_ms)
    now, i, plans = 0, 0, []
    for _ in range(max_steps):
        if until is not None and now >= until:
            break
        while i < len(arrivals) and arrivals[i].arrived_ms <= now:
            assert sched.offer(arrivals[i])
            i += 1
        wait = sched.wait_ms(now)
        nxt = arrivals[i].arrived_ms if i < len(arrivals) else None
        if wait is None:
            if nxt is None:
                break
            now = nxt
        elif wait > 0:
            assert sched.next_batch(now) is None  # wait_ms and next_batch agree
            now = now + wait if nxt is None else min(now + wait, nxt)
        else:
            plan = sched.next_batch(now)
            assert plan is not None
            plans.append((now, plan))
            if plan.items:
                ms = latency(plan)
                now += math.ceil(ms)
                sched.observe(plan, latency_ms=ms, utilisation=utilisation, now_ms=now)
    else:
        raise AssertionError("the scheduler never drained")
    return plans


def lanes_of(plan: Plan[Item]) -> list[str]:
    return [it.lane for it in plan.items]
