"""Signals against the flow: what a later stage tells, routed by the runtime to an earlier one.

A stage hands its output forward and knows nothing of the stages before it.
What must go back is an event, emitted to the one dispatcher,
:meth:`pipeline.worker.runtime.Runtime.dispatch`, the only place that knows
who reacts to each:

- :class:`RoomFreed`: a lane may take records again (the ledger freed room, a
  lane resumed, parked work was queued) → the lane reader is woken;
- :class:`Answered`: a request got its answer, late or not → load shedding
  observes it, and what shedding decides reaches the deadlines and the gates;
- :class:`Acked` / :class:`Unstored`: a leader's result is in Kafka (store it,
  before its input is released) or will never be stored → dedupe;
- :class:`Recompute`: a stored result proved unusable → the work is queued
  again;
- :class:`AnswerPathFailed`: an answer could not be made durable → the worker
  stops (the app's handler).

Dispatch is synchronous: an event's reaction has happened when ``emit``
returns, and what it raises reaches the emitter (a store that cannot write
fails the answer path before the input is released).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.worker.records import Work

__all__ = [
    "Acked",
    "AnswerPathFailed",
    "Answered",
    "Emit",
    "Event",
    "Recompute",
    "RoomFreed",
    "Unstored",
]


@dataclass(frozen=True)
class RoomFreed:
    """A lane may take records again."""


@dataclass(frozen=True)
class Answered:
    """A request of ``lane`` was answered at ``at_ms`` (``late``: after its deadline,
    or dead-lettered as expired)."""

    lane: str
    at_ms: int
    late: bool


@dataclass(frozen=True)
class Acked:
    """``leader``'s encoded result ``value`` is acknowledged by the broker."""

    leader: Work
    value: bytes


@dataclass(frozen=True)
class Unstored:
    """``leader``'s result will not be stored (its answer failed, or the worker stops)."""

    leader: Work


@dataclass(frozen=True)
class Recompute:
    """``work``'s stored result is unreadable or another version's: compute it."""

    work: Work


@dataclass(frozen=True)
class AnswerPathFailed:
    """An answer could not be made durable: the worker must stop (inputs stay
    uncommitted and are redelivered)."""

    failure: BaseException


Event = RoomFreed | Answered | Acked | Unstored | Recompute | AnswerPathFailed
#: Hands an event to the runtime's dispatcher; returns once it was reacted to.
Emit = Callable[[Event], Any]
