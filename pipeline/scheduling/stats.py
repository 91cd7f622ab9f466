"""What the scheduler decided, counted: batches, tokens, dispatch reasons, expiries and
waits per lane, and the last plan; :meth:`SchedulerStats.snapshot` flattens them for
the metrics and the bench. Pure: the scheduler calls it, nothing else writes it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

from pipeline.scheduling.budget import Plan
from pipeline.scheduling.lanes import LaneQueues, Queued

__all__ = ["REASONS", "SchedulerStats"]

REASONS = ("deadline", "aged", "full", "window", "expired")

T = TypeVar("T", bound=Queued)


class SchedulerStats(Generic[T]):
    """Counters and last-batch gauges of one scheduler."""

    def __init__(self, lanes: Iterable[str]) -> None:
        self.lanes = tuple(lanes)
        self.batches = 0
        self.items = 0
        self.real_tokens = 0
        self.padded_tokens = 0
        self.reasons: dict[str, int] = dict.fromkeys(REASONS, 0)
        self.expired: dict[str, int] = dict.fromkeys(self.lanes, 0)
        self.swept = 0  # of them, expired by a sweep while the engine was busy
        self.wait_sum_ms: dict[str, int] = dict.fromkeys(self.lanes, 0)
        self.wait_max_ms: dict[str, int] = dict.fromkeys(self.lanes, 0)
        self.served: dict[str, int] = dict.fromkeys(self.lanes, 0)
        self.last: Plan[T] | None = None

    def planned(self, plan: Plan[T], now_ms: int) -> None:
        """A batch was planned at ``now_ms``."""
        self.last = plan
        self.batches += 1
        self.items += len(plan.items)
        self.real_tokens += plan.real_tokens
        self.padded_tokens += plan.padded_tokens
        self.reasons[plan.reason] += 1
        for item in plan.items:
            wait = now_ms - item.arrived_ms
            self.served[item.lane] += 1
            self.wait_sum_ms[item.lane] += wait
            self.wait_max_ms[item.lane] = max(self.wait_max_ms[item.lane], wait)

    def expire(self, items: Iterable[T]) -> None:
        """``items`` were expired."""
        for item in items:
            self.expired[item.lane] += 1

    def snapshot(self, queues: LaneQueues[T]) -> dict[str, float]:
        """Every counter and gauge, with ``queues``' depths and pauses, as a flat map."""
        out: dict[str, float] = {
            "pending": float(len(queues)),
            "batches": float(self.batches),
            "items": float(self.items),
            "real_tokens": float(self.real_tokens),
            "padded_tokens": float(self.padded_tokens),
            "padding_ratio": 1 - self.real_tokens / self.padded_tokens if self.padded_tokens else 0,
            "pauses": float(queues.pauses),
            "resumes": float(queues.resumes),
            "expired_swept": float(self.swept),
        }
        last = self.last
        if last is not None:
            out |= {
                "batch_size_last": float(len(last.items)),
                "batch_tokens_last": float(last.padded_tokens),
                "padding_ratio_last": last.padding_ratio,
                "budget_effective_last": float(last.budget),
                "predicted_ms_last": last.predicted_ms,
            }
        for reason, n in self.reasons.items():
            out[f"dispatch_{reason}"] = float(n)
        for lane in self.lanes:
            served = self.served[lane]
            out[f"depth_{lane}"] = float(queues.depth(lane))
            out[f"paused_{lane}"] = float(lane in queues.paused)
            out[f"rejected_{lane}"] = float(queues.rejected[lane])
            out[f"expired_{lane}"] = float(self.expired[lane])
            out[f"served_{lane}"] = float(served)
            out[f"wait_ms_mean_{lane}"] = self.wait_sum_ms[lane] / served if served else 0.0
            out[f"wait_ms_max_{lane}"] = float(self.wait_max_ms[lane])
        return out
