"""Guards around the runtime: load shedding and the model's circuit breaker.

The policies themselves are pure (``scheduling/degrade.py``,
``scheduling/breaker.py``); this module feeds them what the worker sees and
logs and counts every transition. It changes nothing itself: what shedding
decides is returned (:meth:`Guard.answered`, :meth:`Guard.tick`) and the
runtime applies it, to the deadlines (``scheduling/deadlines.py``) and the
lane gates. The runtime asks it which lanes shedding wants paused, whether
the model may be called now, and how to cut a text under shedding.
"""

from __future__ import annotations

import logging
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

    def __init__(self, settings: Settings, *, metrics: PipelineMetrics) -> None:
        self._metrics = metrics
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

    def answered(self, now_ms: int, lane: str, *, late: bool) -> Shedding | None:
        """Every answer to a request: a result, or an expired dead letter (late).
        Returns shedding's new actions when its level changed (the caller applies them)."""
        if self.shedder is None:
            return None
        return self._changed(self.shedder.observe(now_ms, lane, late))

    def tick(self, now_ms: int) -> Shedding | None:
        """Call about once a second: a quiet lane must still be able to recover.
        Returns shedding's new actions when its level changed."""
        if self.breaker is not None:
            self._log_breaker(self.breaker.poll(now_ms))
        if self.shedder is None:
            return None
        return self._changed(self.shedder.poll(now_ms))

    def _changed(self, transition: ShedTransition | None) -> Shedding | None:
        if transition is None:
            return None
        log.warning("%s", transition)
        self._metrics.shed_level(transition.to_level)
        return self.actions

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
