"""Deadlines: the one owner of when each request must be answered, and what lateness means.

Three things decide a request's deadline, and all of them are here:

- its lane's budget (``PIPELINE_WORKER_LANE_DEADLINE_MS_*``), which intake
  adds to the request's creation time (a request's own deadline may shorten
  it, never lengthen it: :func:`pipeline.worker.intake.parse`);
- load shedding, which may shorten a standard request's budget as it is
  queued (:meth:`Deadlines.schedule_by`) and make late standard requests
  expire; shedding changes deadlines only through :meth:`Deadlines.shed`;
- which lanes expire a request that can no longer make its deadline
  (``PIPELINE_WORKER_EXPIRE_LANES``, plus shedding's): :meth:`expires`, the
  question the scheduler asks before it judges a request hopeless.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from pipeline.scheduling.degrade import Shedding
from pipeline.settings import Lane

__all__ = ["Deadlines"]

_NORMAL = Shedding()


class Deadlines:
    """Lane budgets, expiring lanes and shedding's changes (see the module's promise)."""

    def __init__(self, lanes: Iterable[Lane]) -> None:
        lanes = tuple(lanes)
        self._budget = {lane.name: lane.deadline_ms for lane in lanes}
        self._base_expire = frozenset(lane.name for lane in lanes if lane.expires)
        self._shedding = _NORMAL

    def lane_ms(self, lane: str) -> int:
        """The lane's deadline budget: a request is due this long after it was made."""
        return self._budget[lane]

    def schedule_by(self, lane: str, *, arrived_ms: int, deadline_ms: int) -> int:
        """The deadline a request that arrived at ``arrived_ms`` is scheduled by, under
        the current shedding (its own ``deadline_ms`` otherwise)."""
        return self._shedding.deadline_ms(lane, arrived_ms=arrived_ms, deadline_ms=deadline_ms)

    def expires(self, lane: str) -> bool:
        """Whether a request of ``lane`` that cannot meet its deadline is dead-lettered
        (``expired``) rather than computed late."""
        return lane in self._base_expire or self._shedding.expires(lane)

    def shed(self, shedding: Shedding) -> None:
        """Load shedding changed its actions: later decisions follow them."""
        self._shedding = shedding
