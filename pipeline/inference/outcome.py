"""What the engine hands back: one :class:`Outcome` per input, per batch.

An outcome is ok (a prediction) or failed (an :class:`InferenceError`), never
both; a :class:`BatchOutcome` holds exactly one per input, in input order.
"""

from __future__ import annotations

import dataclasses

from pipeline.errors import InferenceError
from pipeline.inference.types import Prediction

__all__ = ["BatchOutcome", "EngineStats", "EngineStopped", "Outcome"]


class EngineStopped(InferenceError):
    """The engine was stopped (or never started) before it could run this batch."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The result for one input: a prediction, or the error that stopped it."""

    prediction: Prediction | None = None
    error: InferenceError | None = None

    def __post_init__(self) -> None:
        assert (self.prediction is None) != (self.error is None), "exactly one of the two"

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclasses.dataclass(frozen=True)
class BatchOutcome:
    """One batch's outcomes (one per input, in order) and what computing them cost.

    Token counts and times add up over every model call the batch needed
    (``model_calls`` > 1 when a failure was bisected). ``idle_before_ms``: how long
    the device sat idle between the end of the engine's previous forward and this
    batch's start (None for the engine's first batch); nothing says whether work
    was waiting meanwhile, the caller knows (:class:`pipeline.worker.batches.HandoverLead`).
    """

    outcomes: list[Outcome]
    batch_size: int
    n_tokens: int = 0
    padded_tokens: int = 0
    tokenize_ms: float = 0.0
    inference_ms: float = 0.0
    model_calls: int = 0
    idle_before_ms: float | None = None

    def __post_init__(self) -> None:
        assert len(self.outcomes) == self.batch_size, "one outcome per input"

    @property
    def failures(self) -> int:
        return sum(1 for o in self.outcomes if not o.ok)


@dataclasses.dataclass(frozen=True)
class EngineStats:
    """Counters since the engine was created."""

    batches: int
    items: int
    failures: int
    model_calls: int
