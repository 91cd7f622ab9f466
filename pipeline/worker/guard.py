"""Guards around the runtime: load shedding and the model's circuit breaker.

The policies themselves are pure (``scheduling/degrade.py``,
``scheduling/breaker.py``); this module feeds them what the worker sees,
applies what they decide to the scheduler, and logs and counts every
transition. The runtime asks it three things: which lanes shedding wants
paused, whether the model may be called now, and how to admit a request
(its deadline under shedding, and whether its text must be cut).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pipeline.observability.metrics import PipelineMetrics
from pipeline.scheduling.breaker import CircuitBreaker
from pipeline.scheduling.degrade import LoadShedder, Shedding, ShedTransition
from pipeline.settings import Settings

__all__ = ["Guard"]

log = logging.getLogger(__name__)

_NORMAL = Shedding()


class Guard:
    """Shedding and breaking for one runtime; every method is cheap and never raises."""

    def __init__(
        self,
        settings: Settings,
        *,
        scheduler: Any,
        metrics: PipelineMetrics,
        on_shed: Callable[[], None] = lambda: None,
    ) -> None:
        self._scheduler = scheduler
        self._metrics = metrics
        self._on_shed = on_shed
        self._base_expire = frozenset(scheduler.expire_lanes)
        self.shedder = LoadShedder(settings.degrade) if settings.degrade.enabled else None
        self.breaker = CircuitBreaker(settings.breaker) if settings.breaker.enabled else None
        if self.breaker is not None:
            metrics.breaker_state(str(self.breaker.state))

    # -- shedding -------------------------------------------------------------

    @property
    def actions(self) -> Shedding:
        """What shedding asks for right now (nothing, when disabled)."""
        return self.shedder.actions if self.shedder is not None else _NORMAL

    @property
    def level(self) -> int:
        return self.shedder.level if self.shedder is not None else 0

    def answered(self, now_ms: int, lane: str, *, late: bool) -> None:
        """Every answer to a request: a result, or an expired dead letter (late)."""
        if self.shedder is not None:
            self._apply(self.shedder.observe(now_ms, lane, late))

    def tick(self, now_ms: int) -> None:
        """Call about once a second: a quiet lane must still be able to recover."""
        if self.shedder is not None:
            self._apply(self.shedder.poll(now_ms))
        if self.breaker is not None:
            self._log_breaker(self.breaker.poll(now_ms))

    def deadline_ms(self, lane: str, *, arrived_ms: int, deadline_ms: int) -> int:
        """The deadline to schedule a new request by, under the current shedding."""
        return self.actions.deadline_ms(lane, arrived_ms=arrived_ms, deadline_ms=deadline_ms)

    def _apply(self, transition: ShedTransition | None) -> None:
        if transition is None:
            return
        log.warning("%s", transition)
        actions = self.actions
        extra = frozenset(lane for lane in self._scheduler.lanes if actions.expires(lane))
        self._scheduler.expire_lanes = self._base_expire | extra
        self._metrics.shed_level(transition.to_level)
        self._on_shed()

    # -- the model's circuit breaker --------------------------------------------

    def model_allowed(self, now_ms: int) -> bool:
        """Whether the primary model may be called now (a half-open probe counts)."""
        if self.breaker is None:
            return True
        allowed = self.breaker.allow(now_ms)
        for t in self.breaker.drain():
            self._log_breaker(t)
        return allowed

    def model_result(self, now_ms: int, *, ok: bool) -> None:
        """One call of the primary model ended; ``ok`` unless every input failed."""
        if self.breaker is not None:
            self.breaker.record(now_ms, ok)
            for t in self.breaker.drain():
                self._log_breaker(t)

    def _log_breaker(self, transition: Any) -> None:
        if transition is None or self.breaker is None:
            return
        log.warning("%s", transition)
        self._metrics.breaker_state(str(self.breaker.state))
