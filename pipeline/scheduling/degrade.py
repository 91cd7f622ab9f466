"""Automatic degradation: shed load in a fixed order while realtime misses its deadlines.

Pure: the caller passes the clock (``now_ms``) and every answer; nothing here
pauses a topic or touches a request. :class:`LoadShedder` says which
:class:`Shedding` actions hold now, and the worker applies them.

The batch-size controller acts first (it shrinks batches when they are slow);
shedding starts only when realtime requests still miss their deadlines. Which
lane is watched, paused or expired early is part of the lane's definition
(:class:`pipeline.settings.lanes.Shed`; today realtime, bulk and standard). The
order, one level at a time, each level keeping the ones below it:

====== ============================================================================
level  what is shed
====== ============================================================================
0      nothing: normal operation
1      the ``PAUSE`` lanes (bulk) are paused (their topics stop being consumed;
       nothing is lost)
2      the ``EXPIRE_EARLY`` lanes' (standard) requests expire early: those lanes
       join the expiring lanes and their deadline budget shrinks to
       ``standard_deadline_factor``
3      texts longer than ``max_text_chars`` characters are cut to that length
====== ============================================================================

When the level changes:

- **Up** one level when, over the last ``window_ms``, at least ``min_samples``
  realtime requests were answered and more than ``miss_ratio_high`` of them
  were late (an expired request counts as late), and at least ``cooldown_ms``
  has passed since the last change.
- **Down** one level once the window has stayed healthy for ``hold_ms``
  without a break (and ``cooldown_ms`` has passed since the last change).
  Healthy means misses / max(answers, ``min_samples``) < ``miss_ratio_low``,
  so a quiet realtime lane counts as healthy.
- Between the two ratios nothing moves (hysteresis). After every change the
  window starts empty, so the next decision is taken on answers given under
  the new level only.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from pipeline.settings import DegradeSettings
from pipeline.settings.lanes import Shed, shed_lanes

__all__ = ["MAX_LEVEL", "LoadShedder", "ShedTransition", "Shedding", "shedding_at"]

#: The highest level (see the module's table).
MAX_LEVEL = 3

#: The lanes whose deadlines are watched.
WATCHED = shed_lanes(Shed.WATCHED)
_PAUSED = shed_lanes(Shed.PAUSE)
_EXPIRE_EARLY = shed_lanes(Shed.EXPIRE_EARLY)

#: Bound on the answers the window holds; older ones are dropped first.
MAX_SAMPLES = 1 << 16


@dataclass(frozen=True)
class Shedding:
    """The actions in force at one level; ``Shedding()`` is normal operation."""

    #: The ``PAUSE`` lanes are paused.
    pause: bool = False
    #: The ``EXPIRE_EARLY`` lanes' late requests expire.
    expire_early: bool = False
    #: The ``EXPIRE_EARLY`` lanes' deadline budgets are shortened by this factor.
    deadline_factor: float = 1.0
    max_text_chars: int | None = None

    @property
    def paused_lanes(self) -> frozenset[str]:
        """Lanes whose consumption must be paused on top of backpressure."""
        return _PAUSED if self.pause else frozenset()

    def expires(self, lane: str) -> bool:
        """Whether shedding makes late requests of ``lane`` expire (on top of the settings)."""
        return self.expire_early and lane in _EXPIRE_EARLY

    def deadline_ms(self, lane: str, *, arrived_ms: int, deadline_ms: int) -> int:
        """The deadline to schedule a request by: an ``EXPIRE_EARLY`` lane's budget
        (deadline minus arrival) is shortened by the factor; others unchanged."""
        if lane not in _EXPIRE_EARLY or self.deadline_factor >= 1.0:
            return deadline_ms
        budget = max(deadline_ms - arrived_ms, 0)
        return arrived_ms + int(budget * self.deadline_factor)

    def clip(self, text: str) -> str:
        """``text`` cut to ``max_text_chars`` characters (unchanged when there is no cap)."""
        if self.max_text_chars is None or len(text) <= self.max_text_chars:
            return text
        return text[: self.max_text_chars]


def shedding_at(level: int, settings: DegradeSettings) -> Shedding:
    """The actions of ``level`` (0..``MAX_LEVEL``), each level keeping those below it."""
    if not 0 <= level <= MAX_LEVEL:
        raise ValueError(f"level {level} outside 0..{MAX_LEVEL}")
    return Shedding(
        pause=level >= 1,
        expire_early=level >= 2,
        deadline_factor=settings.standard_deadline_factor if level >= 2 else 1.0,
        max_text_chars=settings.max_text_chars if level >= 3 else None,
    )


@dataclass(frozen=True)
class ShedTransition:
    """One level change, for the log and the metrics."""

    from_level: int
    to_level: int
    reason: str
    at_ms: int
    miss_ratio: float
    samples: int

    @property
    def escalation(self) -> bool:
        return self.to_level > self.from_level

    def __str__(self) -> str:
        verb = "escalated" if self.escalation else "de-escalated"
        return (
            f"load shedding {verb} {self.from_level} -> {self.to_level}: {self.reason} "
            f"(realtime miss ratio {self.miss_ratio:.3f} over {self.samples} answers)"
        )


class LoadShedder:
    """The degradation level and the policy that moves it (see the module's promise)."""

    def __init__(self, settings: DegradeSettings) -> None:
        self.settings = settings
        self._level = 0
        self._actions = Shedding()
        self._samples: deque[tuple[int, bool]] = deque()
        self._misses = 0
        self._now = -(1 << 62)
        self._changed_at: int | None = None
        self._healthy_since: int | None = None
        self._pending: list[ShedTransition] = []
        self.escalations = 0
        self.deescalations = 0
        self.observed = 0
        self.late = 0

    @property
    def level(self) -> int:
        return self._level

    @property
    def actions(self) -> Shedding:
        """What is shed now."""
        return self._actions

    def observe(self, now_ms: int, lane: str, late: bool) -> ShedTransition | None:
        """Count one answered request (``late``: answered after its deadline, or
        expired); returns the level change it caused, if any. Only the watched
        lane's (realtime's) answers weigh; others are ignored."""
        now = self._tick(now_ms)
        if lane not in WATCHED or not self.settings.enabled:
            return self.poll(now)
        self.observed += 1
        self.late += late
        self._samples.append((now, late))
        self._misses += late
        if len(self._samples) > MAX_SAMPLES:
            self._drop_oldest()
        return self.poll(now)

    def poll(self, now_ms: int) -> ShedTransition | None:
        """Re-evaluate at ``now_ms``; returns the level change, if any. Call it
        now and then (say every second) too, so a quiet realtime lane still
        lets the level come down."""
        now = self._tick(now_ms)
        if not self.settings.enabled:
            return None
        s = self.settings
        self._trim(now)
        samples, misses = len(self._samples), self._misses
        ratio = misses / samples if samples else 0.0
        healthy = misses < s.miss_ratio_low * max(samples, s.min_samples)
        if not healthy:
            self._healthy_since = None
        elif self._healthy_since is None:
            self._healthy_since = now
        cooled = self._changed_at is None or now - self._changed_at >= s.cooldown_ms
        if not cooled:
            return None
        if samples >= s.min_samples and ratio > s.miss_ratio_high and self._level < MAX_LEVEL:
            reason = f"more than {s.miss_ratio_high:.3f} of realtime answers late"
            return self._move(self._level + 1, reason, now, ratio, samples)
        since = self._healthy_since
        if self._level > 0 and since is not None and now - since >= s.hold_ms:
            reason = f"realtime miss ratio under {s.miss_ratio_low:.3f} for {now - since} ms"
            return self._move(self._level - 1, reason, now, ratio, samples)
        return None

    def drain(self) -> list[ShedTransition]:
        """Level changes since the last drain, oldest first (for the log)."""
        pending, self._pending = self._pending, []
        return pending

    def miss_ratio(self, now_ms: int) -> tuple[float, int]:
        """The window's realtime miss ratio and its number of answers at ``now_ms``."""
        self._trim(self._tick(now_ms))
        samples = len(self._samples)
        return (self._misses / samples if samples else 0.0), samples

    def snapshot(self) -> dict[str, float]:
        """Gauges and counters of the shedder, for metrics."""
        samples = len(self._samples)
        return {
            "level": float(self._level),
            "escalations": float(self.escalations),
            "deescalations": float(self.deescalations),
            "window_samples": float(samples),
            "window_miss_ratio": self._misses / samples if samples else 0.0,
            "realtime_observed": float(self.observed),
            "realtime_late": float(self.late),
        }

    def _tick(self, now_ms: int) -> int:
        # A clock that steps back is held where it was: windows never run backwards.
        self._now = max(self._now, now_ms)
        return self._now

    def _trim(self, now: int) -> None:
        horizon = now - self.settings.window_ms
        while self._samples and self._samples[0][0] <= horizon:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, late = self._samples.popleft()
        self._misses -= late

    def _move(
        self, level: int, reason: str, now: int, ratio: float, samples: int
    ) -> ShedTransition:
        change = ShedTransition(self._level, level, reason, now, ratio, samples)
        if level > self._level:
            self.escalations += 1
            self._healthy_since = None
        else:
            self.deescalations += 1
            self._healthy_since = now
        self._level = level
        self._actions = shedding_at(level, self.settings)
        self._changed_at = now
        self._samples.clear()
        self._misses = 0
        self._pending.append(change)
        return change
