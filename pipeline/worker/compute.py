"""The compute stage: one formed batch through the model, every requester answered.

A batch's work is deduped twice more before the model is called: a twin in
the same batch, or a computation of the same hash already in flight, waits
for that one's result (:class:`~pipeline.dedupe.SingleFlight`); a result
computed earlier but not yet durably stored is served from memory, so
queued work that missed the stored-result lookup at intake has no gap.

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

from pipeline.dedupe import SingleFlight, StoredResults
from pipeline.errors import CircuitOpenError, InferenceError
from pipeline.guard import Guard
from pipeline.inference import InferenceEngine, Prediction
from pipeline.metrics import PipelineMetrics
from pipeline.publish import backoff_ms
from pipeline.scheduling import Scheduler
from pipeline.settings import Settings
from pipeline.worker.answers import Answer, Answers
from pipeline.worker.records import Work

__all__ = ["Compute", "Ran"]


@dataclass(frozen=True)
class Ran:
    """One model call: its duration and the tokens the model really computed (on a
    CPU a batch is padded to its longest text, not to the scheduler's bucket)."""

    ms: float
    real_tokens: int = 0
    padded_tokens: int = 0


class Compute:
    """Runs batches through the model and fans the results out (see the module's promise).

    ``spawn`` starts a task the worker tracks until it closes;
    ``serve_stored`` answers work from a stored result (or requeues it).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        engine: InferenceEngine,
        answers: Answers,
        guard: Guard,
        scheduler: Scheduler[Work],
        metrics: PipelineMetrics,
        stored: StoredResults | None,
        fallback: InferenceEngine | None,
        fallback_model: tuple[str, str] | None,
        clock_ms: Callable[[], int],
        spawn: Callable[[Awaitable[Any]], asyncio.Task[Any]],
        serve_stored: Callable[[Work, bytes], Awaitable[None]],
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.answers = answers
        self.guard = guard
        self.scheduler = scheduler
        self.metrics = metrics
        self.stored = stored
        self.fallback = fallback
        self.fallback_model = fallback_model
        self._clock_ms = clock_ms
        self._spawn = spawn
        self._serve_stored = serve_stored
        self.flight: SingleFlight[Work] = SingleFlight()
        # Computed results not yet durably stored: dedupe key -> (prediction, leader).
        self._settled: dict[str, tuple[Prediction, Work]] = {}

    async def run_batch(
        self, batch: list[Work], *, shape: tuple[int, int] | None = None
    ) -> Ran | None:
        """Dedupe within the batch and against work in flight, then compute the rest.

        ``shape`` (sequence length, rows) is the batch's bucketed shape, for
        the engine's padding. Returns what the model call did, or None when
        nothing ran.
        """
        now = self._clock_ms()
        leaders: list[Work] = []
        in_this_batch: set[str] = set()
        for work in batch:
            # Expiry is the scheduler's call alone: it planned this batch to end in time,
            # so a request late now (the batch waited for the engine) is computed.
            req = work.request
            work.queue_ms = float(now - work.arrived_ms)
            self.metrics.wait(req.lane, work.queue_ms / 1000)
            if self._answer_known(work):
                continue
            if self.flight.join(req.dedupe_key, work):
                leaders.append(work)
                in_this_batch.add(req.dedupe_key)
            else:
                work.served = "batch" if req.dedupe_key in in_this_batch else "inflight"
        if leaders:
            return await self._compute(leaders, shape=shape)
        return None

    def _answer_known(self, work: Work) -> bool:
        """Serve ``work`` from a result computed earlier, if there is one.

        Queued work may have missed the stored-result lookup at intake while
        its twin was being computed; a result stays in ``_settled`` until it is
        durably stored, so between the two there is no gap.
        """
        h = work.request.dedupe_key
        settled = self._settled.get(h)
        if settled is not None:
            prediction, leader = settled
            work.served = "inflight"
            self._spawn(self._answer(work, leader, prediction))
            return True
        unusable = work.stored_unusable  # found unusable before: asking again would loop
        stored = self.stored.get(h) if self.stored and not unusable else None
        if stored is not None:
            self._spawn(self._serve_stored(work, stored))
            return True
        return False

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
        answers: list[Answer] = []
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
        return Ran(outcome.inference_ms, outcome.n_tokens, outcome.padded_tokens)

    async def _retry(self, work: Work) -> None:
        await asyncio.sleep(backoff_ms(work.attempts, self.settings.retry) / 1000)
        await self._compute([work], retry=True)

    def _complete(
        self, leader: Work, prediction: Prediction | None, error: BaseException | None
    ) -> list[Answer]:
        """Every requester of the leader's key: dead-lettered at once on ``error``, else
        returned as results to publish (the caller publishes a batch's together; the
        leader's is stored, and until then its result is served from memory)."""
        h = leader.request.dedupe_key
        waiters = self.flight.finish(h)
        if prediction is None:
            assert error is not None
            for work in waiters:
                rid = work.request.request_id
                self._spawn(self.answers.dead_letter(work.incoming, error, leader.attempts, rid))
            return []
        self._settled[h] = (prediction, leader)
        stored: Callable[[], object] = lambda: self._settled.pop(h, None)  # noqa: E731
        return [(work, leader, prediction, stored) for work in waiters]

    async def _answer(self, work: Work, leader: Work, prediction: Prediction) -> None:
        h = leader.request.dedupe_key
        await self.answers.result(
            work, prediction, leader=leader, on_stored=lambda: self._settled.pop(h, None)
        )
