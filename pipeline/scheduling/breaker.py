"""The model's circuit breaker: stop calling a model that keeps failing, probe it later.

Pure: the caller passes the clock (``now_ms``) and the outcome of every model
call; nothing here calls a model or logs. Every state change is returned as a
:class:`BreakerTransition` (and kept for :meth:`CircuitBreaker.drain`) so the
caller can log it and count it.

States::

    closed ──failures_to_open consecutive failures──► open
    open ──open_ms passed──► half_open        (one probe call is let through)
    half_open ──probe ok──► closed            (open time back to open_ms)
    half_open ──probe failed──► open          (open time doubled, at most open_ms_max)

A *failed call* is a model call that raised as a whole, or a batch in which
every input failed. A batch where only some inputs failed is a success: the
model works and bisection isolates the bad texts, so one poison text never
opens the breaker. Failures count only while consecutive: any success resets
the streak. Callers should not record single-input retries of a text that
already failed (that text, not the model, is the likely cause).

While open, :meth:`CircuitBreaker.allow` says no: the caller sends the
requests to the fallback model, or dead-letters them at once with
:class:`~pipeline.errors.CircuitOpenError`. Outcomes recorded while open, or
while half open before the probe was let through, are of calls started
earlier and are ignored. A probe whose outcome never comes is given up after
another ``open_ms``, and a new probe is let through.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pipeline.settings import BreakerSettings

__all__ = ["BreakerTransition", "CircuitBreaker", "State"]

#: Factor on the open time after each failed probe (capped at ``open_ms_max``).
BACKOFF = 2


class State(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


#: The counter each state's entry bumps.
_ENTERED = {State.OPEN: "opened", State.HALF_OPEN: "half_opened", State.CLOSED: "closed"}


@dataclass(frozen=True)
class BreakerTransition:
    """One state change, for the log and the metrics."""

    from_state: State
    to_state: State
    reason: str
    at_ms: int
    #: How long the breaker stays open now (0 unless ``to_state`` is open).
    open_ms: int = 0

    def __str__(self) -> str:
        text = f"model circuit {self.from_state} -> {self.to_state}: {self.reason}"
        return f"{text} (open for {self.open_ms} ms)" if self.open_ms else text


class CircuitBreaker:
    """Closed, open or half open (see the module's promise)."""

    def __init__(self, settings: BreakerSettings) -> None:
        self.settings = settings
        self._state = State.CLOSED
        self._streak = 0
        self._open_ms = settings.open_ms
        self._opened_at = 0
        self._probe_at: int | None = None
        self._pending: list[BreakerTransition] = []
        self.counts: dict[str, int] = dict.fromkeys(
            ["opened", "half_opened", "closed", "rejected", "probes", "failures", "successes"], 0
        )

    @property
    def state(self) -> State:
        """The state as of the last call (``poll`` moves open to half open in time)."""
        return self._state

    @property
    def open_ms(self) -> int:
        """The open time in force: ``open_ms``, grown by failed probes."""
        return self._open_ms

    def poll(self, now_ms: int) -> BreakerTransition | None:
        """Move open to half open once ``open_ms`` has passed; returns that change."""
        if self._state is State.OPEN and now_ms >= self._opened_at + self._open_ms:
            self._probe_at = None
            return self._move(State.HALF_OPEN, f"open for {now_ms - self._opened_at} ms", now_ms)
        return None

    def allow(self, now_ms: int) -> bool:
        """Whether the next model call may go ahead. Half open, it says yes once
        (the probe) until that call's outcome is recorded; a change it makes is
        left for :meth:`drain`."""
        if not self.settings.enabled:
            return True
        self.poll(now_ms)
        if self._state is State.CLOSED:
            return True
        if self._state is State.HALF_OPEN and (
            self._probe_at is None or now_ms - self._probe_at >= self.settings.open_ms
        ):
            self._probe_at = now_ms
            self.counts["probes"] += 1
            return True
        self.counts["rejected"] += 1
        return False

    def record(self, now_ms: int, ok: bool) -> BreakerTransition | None:
        """Record one model call's outcome (``ok``: it was not a failed call, see
        the module); returns the state change it caused, if any."""
        self.counts["successes" if ok else "failures"] += 1
        if not self.settings.enabled:
            return None
        if self._state is State.CLOSED:
            self._streak = 0 if ok else self._streak + 1
            if self._streak >= self.settings.failures_to_open:
                return self._open(f"{self._streak} consecutive failed model calls", now_ms)
            return None
        if self._state is State.OPEN or self._probe_at is None:
            return None  # a call started before the breaker opened
        if ok:
            self._open_ms = self.settings.open_ms
            return self._move(State.CLOSED, "probe call succeeded", now_ms)
        self._open_ms = min(self._open_ms * BACKOFF, self.settings.open_ms_max)
        return self._open("probe call failed", now_ms)

    def drain(self) -> list[BreakerTransition]:
        """State changes since the last drain, oldest first (for the log)."""
        pending, self._pending = self._pending, []
        return pending

    def snapshot(self) -> dict[str, float]:
        """Gauges and counters of the breaker, for metrics (state: 0 closed,
        1 half open, 2 open)."""
        level = {State.CLOSED: 0, State.HALF_OPEN: 1, State.OPEN: 2}[self._state]
        return {
            "state": float(level),
            "open_ms": float(self._open_ms),
            "failure_streak": float(self._streak),
            **{name: float(value) for name, value in self.counts.items()},
        }

    def _open(self, reason: str, now_ms: int) -> BreakerTransition:
        self._opened_at = now_ms
        self._streak = 0
        self._probe_at = None
        return self._move(State.OPEN, reason, now_ms, self._open_ms)

    def _move(self, state: State, reason: str, now_ms: int, open_ms: int = 0) -> BreakerTransition:
        change = BreakerTransition(self._state, state, reason, now_ms, open_ms)
        self._state = state
        self.counts[_ENTERED[state]] += 1
        self._pending.append(change)
        return change
