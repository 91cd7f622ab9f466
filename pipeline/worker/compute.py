"""The compute stage: one formed batch through the model, every requester answered.

A batch's work is deduped again before the model is called
(:meth:`~pipeline.worker.repeats.Repeats.lead`): work whose result became
known while it was queued is answered from it, and a twin in the same batch,
or of a computation already in flight, waits for that one's result.

Each leader runs through the model (its fallback while the breaker is open),
is retried with backoff on a failed prediction, and then ends in exactly one
result or dead letter for every requester of its hash, through
:mod:`pipeline.worker.answers`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pipeline.errors import CircuitOpenError, InferenceError
from pipeline.inference import InferenceEngine, Prediction
from pipeline.observability.metrics import PipelineMetrics
from pipeline.settings import Settings
from pipeline.worker.answers import Answers
from pipeline.worker.guard import Guard
from pipeline.worker.publish import backoff_ms
from pipeline.worker.records import Work
from pipeline.worker.repeats import Known, Repeats

__all__ = ["Compute", "Ran"]


@dataclass(frozen=True)
class Ran:
    """One model call: its duration and the tokens the model really computed (on a
    CPU a batch is padded to its longest text, not to the scheduler's bucket)."""

    ms: float
    real_tokens: int = 0
    padded_tokens: int = 0
    idle_before_ms: float | None = None  # the device's wait before it (BatchOutcome)


class Compute:
    """Runs batches through the model and fans the results out (see the module's promise).

    ``spawn`` starts a task the worker tracks until it closes.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        engine: InferenceEngine,
        answers: Answers,
        guard: Guard,
        metrics: PipelineMetrics,
        repeats: Repeats,
        fallback: InferenceEngine | None,
        fallback_model: tuple[str, str] | None,
        clock_ms: Callable[[], int],
        spawn: Callable[[Awaitable[Any]], asyncio.Task[Any]],
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.answers = answers
        self.guard = guard
        self.metrics = metrics
        self.repeats = repeats
        self.fallback = fallback
        self.fallback_model = fallback_model
        self._clock_ms = clock_ms
        self._spawn = spawn

    async def run_batch(
        self, batch: list[Work], *, shape: tuple[int, int] | None = None
    ) -> Ran | None:
        """Dedupe within the batch and against work in flight, then compute the rest.

        ``shape`` (sequence length, rows) is the batch's bucketed shape, for
        the engine's padding. Returns what the model call did, or None when
        nothing ran.
        """
        now = self._clock_ms()
        for work in batch:
            # Expiry is the scheduler's call alone: it planned this batch to end in time,
            # so a request late now (the batch waited for the engine) is computed.
            work.queue_ms = float(now - work.arrived_ms)
            self.metrics.wait(work.request.lane, work.queue_ms / 1000)
        known: list[Work] = []

        def answer_known(work: Work, found: Known) -> None:
            answer = self.answers.known(work, found)
            if answer is not None:
                known.append(answer)  # published with the batch's other results

        leaders = self.repeats.lead(batch, answer_known)
        if known:
            self._spawn(self.answers.results(known))
        if leaders:
            return await self._compute(leaders, shape=shape)
        return None

    async def _compute(
        self, leaders: list[Work], *, retry: bool = False, shape: tuple[int, int] | None = None
    ) -> Ran:
        """Run the leaders through the model (or its fallback while the breaker is open)."""
        now = self._clock_ms()
        engine, model = self.engine, None
        if not self.guard.model_allowed(now):
            if self.fallback is None:
                error = CircuitOpenError(
                    "model circuit breaker is open after repeated failures; dead-lettered "
                    "at once (replay it once the model is healthy)"
                )
                for work in leaders:
                    self._complete(work, None, error)
                return Ran(0.0)
            engine, model = self.fallback, self.fallback_model
        texts = []
        actions = self.guard.actions
        for work in leaders:
            work.attempts += 1
            work.model = model
            text = actions.clip(work.request.text)
            work.storable = work.storable and text == work.request.text
            texts.append(text)
        try:
            pad_to, rows = shape or (None, None)
            outcome = await engine.run(texts, pad_to=pad_to, rows=rows)
        except InferenceError as exc:  # the engine itself is gone (shutting down)
            for work in leaders:
                self._complete(work, None, exc)
            return Ran(float(self._clock_ms() - now))
        if engine is self.engine and not retry:
            self.guard.model_result(self._clock_ms(), ok=outcome.failures < outcome.batch_size)
        stats = {"inference_ms": outcome.inference_ms, "batch_size": float(outcome.batch_size)}
        answers: list[Work] = []
        for work, result in zip(leaders, outcome.outcomes, strict=True):
            work.stats = stats
            if result.prediction is not None:
                answers += self._complete(work, result.prediction, None)
            elif work.attempts >= self.settings.retry.max_attempts:
                self._complete(work, None, result.error or InferenceError("no prediction"))
            else:
                self._spawn(self._retry(work))
        if answers:
            self._spawn(self.answers.results(answers))  # one task for the batch's results
        return Ran(
            outcome.inference_ms, outcome.n_tokens, outcome.padded_tokens, outcome.idle_before_ms
        )

    async def _retry(self, work: Work) -> None:
        await asyncio.sleep(backoff_ms(work.attempts, self.settings.retry) / 1000)
        await self._compute([work], retry=True)

    def _complete(
        self, leader: Work, prediction: Prediction | None, error: BaseException | None
    ) -> list[Work]:
        """Every requester of the leader's key: dead-lettered at once on ``error``, else
        returned as results to publish (the caller publishes a batch's together)."""
        waiters = self.repeats.finish(leader, prediction)
        if prediction is None:
            assert error is not None
            for work in waiters:
                rid = work.request.request_id
                self._spawn(self.answers.dead_letter(work.incoming, error, leader.attempts, rid))
            return []
        return [work.answered_by(leader, prediction) for work in waiters]
