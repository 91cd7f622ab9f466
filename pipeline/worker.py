"""The worker's core, free of Faust: intake → dedupe → batches → model → publish → ack.

Every input that :meth:`Runtime.submit` accepts ends in exactly one result or
one dead letter, and is released for commit only after that record was
acknowledged by the broker, in offset order per partition:

    publish result/dead letter → await broker ack → store dedupe entry → release offset

Faust is reached only through three injected callables: the producer's send,
the table the stored results live in, and ``ack`` for a released input.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.acks import OffsetWatermark
from pipeline.codec import result_codec
from pipeline.dedupe import SingleFlight, StoredResults
from pipeline.errors import ExpiredError, InferenceError, PermanentError, PublishError
from pipeline.inference import InferenceEngine, Prediction
from pipeline.intake import Request, parse
from pipeline.publish import Origin, Publisher, backoff_ms, dead_letter_record, result_record
from pipeline.scheduling import Controller, Item, Plan, Scheduler
from pipeline.settings import LANES, Settings

__all__ = ["Incoming", "Runtime"]

log = logging.getLogger(__name__)

AckFn = Callable[[Any], Awaitable[None]]
PauseFn = Callable[[str, bool], None]
StoreFn = Callable[[Any, Callable[[], None]], None]


def wall_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Incoming:
    """One consumed record and the opaque token that acknowledges it."""

    lane: str
    origin: Origin
    token: Any


@dataclass
class Work:
    """A valid request on its way through batching and the model."""

    incoming: Incoming
    request: Request
    arrived_ms: int
    served: str = "computed"
    attempts: int = 0
    queue_ms: float = 0.0
    stats: dict[str, float] = field(default_factory=dict)


class Runtime:
    """Runs the pipeline's stages for one worker process (see the module's promise)."""

    def __init__(
        self,
        settings: Settings,
        *,
        engine: InferenceEngine,
        publisher: Publisher,
        ack: AckFn,
        stored: StoredResults | None = None,
        store_in_context: StoreFn | None = None,
        pause_lane: PauseFn | None = None,
        clock_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.publisher = publisher
        self.stored = stored if settings.dedupe.enabled else None
        self._ack = ack
        self._store_in_context = store_in_context or (lambda token, fn: fn())
        self._clock_ms = clock_ms
        self.model_name = settings.model.display_name
        self.model_version = settings.model.version
        self.model_id = settings.model.model_id
        self.watermark: OffsetWatermark[Any] = OffsetWatermark()
        self.flight: SingleFlight[Work] = SingleFlight()
        # Computed results not yet durably stored: hash -> (prediction, leader).
        self._settled: dict[str, tuple[Prediction, Work]] = {}
        self.controller = Controller(
            settings.scheduler, slo_ms=settings.worker.lane_deadline_ms("realtime")
        )
        self.scheduler: Scheduler[Work] = Scheduler(
            settings.scheduler,
            expire_lanes=frozenset(lane for lane in LANES if settings.worker.expires(lane)),
            controller=self.controller,
        )
        self._pause_lane = pause_lane or (lambda lane, paused: None)
        self.paused: set[str] = set()
        # Per lane, so a flooded bulk lane never blocks realtime intake.
        self._inflight = {lane: asyncio.Semaphore(settings.batch.max_inflight) for lane in LANES}
        self._room = {lane: asyncio.Event() for lane in LANES}
        self._wake = asyncio.Event()
        # One batch at a time is formed and run: forming it at the last moment
        # lets late realtime requests in and keeps the deadline predictions true.
        self._batch_slots = asyncio.Semaphore(1)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.counters: dict[str, int] = dict.fromkeys(
            ["received", "results", "dead_letters", "stored", "inflight", "batch", "computed"], 0
        )

    # -- intake ---------------------------------------------------------------

    async def submit(self, incoming: Incoming) -> None:
        """Accept one consumed record; waits (backpressure) while too much is in flight.

        Must be called in offset order per partition, from the consuming
        context (stored-result lookups read the partition's table there).
        """
        await self._inflight[incoming.lane].acquire()
        origin = incoming.origin
        tp = (origin.topic, origin.partition)
        try:
            self.watermark.track(tp, origin.offset, incoming.token)
        except ValueError:
            # The partition was rewound (a rebalance handed it back from its last
            # commit): what was in flight for it is being delivered again.
            self.forget_partition(*tp)
            self.watermark.track(tp, origin.offset, incoming.token)
        self.counters["received"] += 1
        now = self._clock_ms()
        try:
            request = parse(
                origin.value,
                lane=incoming.lane,
                lane_deadline_ms=self.settings.worker.lane_deadline_ms(incoming.lane),
                model_id=self.model_id,
                limits=self.settings.validation,
                received_at_ms=now,
            )
        except PermanentError as exc:
            rid = getattr(exc, "request_id", None)
            self._spawn(self._dead_letter(incoming, exc, attempts=1, request_id=rid))
            return
        stored = self.stored.get(request.content_hash) if self.stored else None
        if stored is not None:
            self._spawn(self._serve_stored(incoming, request, stored))
            return
        await self._enqueue(Work(incoming=incoming, request=request, arrived_ms=now))

    async def _enqueue(self, work: Work) -> None:
        """Hand work to the scheduler; wait (with the lane paused) while its lane is full."""
        req = work.request
        # A cheap estimate (about four characters per token) is enough to bucket by length.
        tokens = min(self.settings.model.max_length, len(req.text) // 4 + 2)
        item = Item(work, req.lane, req.deadline_ms, work.arrived_ms, tokens)
        while not self.scheduler.offer(item):
            self._apply_pauses()
            self._room[req.lane].clear()
            await self._room[req.lane].wait()
        self._apply_pauses()
        self._wake.set()

    def _apply_pauses(self) -> None:
        for lane in self.scheduler.lanes_to_pause():
            self.paused.add(lane)
            self._pause_lane(lane, True)
            log.info("lane %s paused: queue at its bound (%d)", lane, self.scheduler.depth(lane))
        for lane in self.scheduler.lanes_to_resume():
            self.paused.discard(lane)
            self._pause_lane(lane, False)
            log.info("lane %s resumed", lane)
        for lane, room in self._room.items():
            if not self.scheduler.full(lane):
                room.set()

    # -- batches --------------------------------------------------------------

    async def run(self) -> None:
        """Ask the scheduler for batches forever; one is formed and run at a time."""
        while True:
            await self._batch_slots.acquire()
            plan = await self._next_plan()
            task = self._spawn(self._run_plan(plan))
            task.add_done_callback(lambda _t: self._batch_slots.release())

    async def _next_plan(self) -> Plan[Work]:
        """Wait until the scheduler has a batch to run; dead-letter what it expired."""
        while True:
            now = self._clock_ms()
            self._wake.clear()
            plan = self.scheduler.next_batch(now)
            if plan is not None:
                self._apply_pauses()
                for item in plan.expired:
                    req = item.payload.request
                    late = now - req.deadline_ms
                    error = ExpiredError(
                        f"cannot meet its deadline ({req.lane}; {late:+d} ms past it now)"
                    )
                    self._spawn(self._dead_letter(item.payload.incoming, error, 1, req.request_id))
                if plan.items:
                    return plan
                continue
            wait = self.scheduler.wait_ms(now)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), None if wait is None else wait / 1000)

    async def _run_plan(self, plan: Plan[Work]) -> None:
        batch = [item.payload for item in plan.items]
        start = self._clock_ms()
        outcome_ms = await self._run_batch(batch)
        self.scheduler.observe(
            plan,
            latency_ms=outcome_ms if outcome_ms is not None else float(self._clock_ms() - start),
            utilisation=self.engine.busy_fraction(),
            now_ms=self._clock_ms(),
        )

    async def _run_batch(self, batch: list[Work]) -> float | None:
        """Dedupe within the batch and against work in flight, then compute the rest.

        Returns the model call's duration in ms, or None when nothing ran.
        """
        now = self._clock_ms()
        leaders: list[Work] = []
        in_this_batch: set[str] = set()
        for work in batch:
            req = work.request
            if now > req.deadline_ms and self.settings.worker.expires(req.lane):
                late = now - req.deadline_ms
                error = ExpiredError(f"deadline passed {late} ms before inference ({req.lane})")
                self._spawn(self._dead_letter(work.incoming, error, 1, req.request_id))
                continue
            work.queue_ms = float(now - work.arrived_ms)
            if self._answer_known(work):
                continue
            if self.flight.join(req.content_hash, work):
                leaders.append(work)
                in_this_batch.add(req.content_hash)
            else:
                work.served = "batch" if req.content_hash in in_this_batch else "inflight"
        if leaders:
            return await self._compute(leaders)
        return None

    def _answer_known(self, work: Work) -> bool:
        """Serve ``work`` from a result computed earlier, if there is one.

        Queued work may have missed the stored-result lookup at intake while
        its twin was being computed; a result stays in ``_settled`` until it is
        durably stored, so between the two there is no gap.
        """
        h = work.request.content_hash
        settled = self._settled.get(h)
        if settled is not None:
            prediction, leader = settled
            work.served = "inflight"
            self._spawn(self._answer(work, leader, prediction))
            return True
        stored = self.stored.get(h) if self.stored else None
        if stored is not None:
            self._spawn(self._serve_stored(work.incoming, work.request, stored))
            return True
        return False

    async def _compute(self, leaders: list[Work]) -> float:
        for work in leaders:
            work.attempts += 1
        outcome = await self.engine.run([w.request.text for w in leaders])
        stats = {
            "inference_ms": outcome.inference_ms,
            "batch_size": float(outcome.batch_size),
        }
        for work, result in zip(leaders, outcome.outcomes, strict=True):
            work.stats = stats
            if result.prediction is not None:
                self._complete(work, result.prediction, None)
            elif work.attempts >= self.settings.retry.max_attempts:
                self._complete(work, None, result.error or InferenceError("no prediction"))
            else:
                self._spawn(self._retry(work))
        return outcome.inference_ms

    async def _retry(self, work: Work) -> None:
        await asyncio.sleep(backoff_ms(work.attempts, self.settings.retry) / 1000)
        await self._compute([work])

    def _complete(
        self, leader: Work, prediction: Prediction | None, error: BaseException | None
    ) -> None:
        """Answer every requester of the leader's hash; the first one stores the result."""
        waiters = self.flight.finish(leader.request.content_hash)
        if prediction is not None:
            self._settled[leader.request.content_hash] = (prediction, leader)
        for work in waiters:
            if prediction is None:
                assert error is not None
                self._spawn(
                    self._dead_letter(
                        work.incoming, error, leader.attempts, work.request.request_id
                    )
                )
            else:
                self._spawn(self._answer(work, leader, prediction))

    async def _answer(self, work: Work, leader: Work, prediction: Prediction) -> None:
        record = result_record(
            work.request,
            prediction,
            model_name=self.model_name,
            model_version=self.model_version,
            task=self.settings.model.task,
            served=work.served,
            completed_at_ms=self._clock_ms(),
            queue_ms=work.queue_ms,
            inference_ms=leader.stats.get("inference_ms", 0.0),
            batch_size=int(leader.stats.get("batch_size", 0)),
        )
        key = work.request.content_hash.encode("ascii")
        try:
            value = await self.publisher.result(key, record)
        except PublishError as exc:
            await self._publish_failed(work.incoming, exc, work.request.request_id)
            return
        self.counters["results"] += 1
        self.counters[work.served] += 1
        if work is leader and self.stored is not None:
            stored = self.stored
            content_hash = work.request.content_hash
            self._store_in_context(work.incoming.token, lambda: stored.put(content_hash, value))
        await self._release(work.incoming)

    async def _serve_stored(self, incoming: Incoming, request: Request, stored: bytes) -> None:
        try:
            record = result_codec().decode(stored)
        except PermanentError:
            record = None
        if record is None or record["model_version"] != self.model_version:
            # Unreadable or another model's: compute it afresh instead.
            await self._enqueue(Work(incoming, request, arrived_ms=self._clock_ms()))
            return
        record = {
            **record,
            "request_id": request.request_id,
            "priority": request.lane,
            "served": "stored",
            "created_at_ms": request.created_at_ms,
            "completed_at_ms": self._clock_ms(),
            "queue_ms": 0.0,
            "inference_ms": 0.0,
            "batch_size": 0,
            "metadata": request.metadata,
        }
        try:
            await self.publisher.result(request.content_hash.encode("ascii"), record)
        except PublishError as exc:
            await self._publish_failed(incoming, exc, request.request_id)
            return
        self.counters["results"] += 1
        self.counters["stored"] += 1
        await self._release(incoming)

    # -- failures and acks ----------------------------------------------------

    async def _dead_letter(
        self, incoming: Incoming, error: BaseException, attempts: int, request_id: str | None
    ) -> None:
        stage = getattr(error, "stage", "infer")
        record = dead_letter_record(
            incoming.origin,
            stage=stage,
            error=error,
            attempts=attempts,
            failed_at_ms=self._clock_ms(),
            request_id=request_id,
        )
        try:
            await self.publisher.dead_letter(record)
        except PublishError as exc:
            log.error(
                "dead letter for %s[%d]@%d not acknowledged (%s); the input stays "
                "uncommitted and will be redelivered after a restart",
                incoming.origin.topic,
                incoming.origin.partition,
                incoming.origin.offset,
                exc,
            )
            return
        self.counters["dead_letters"] += 1
        log.info(
            "dead letter: %s[%d]@%d stage=%s %s",
            incoming.origin.topic,
            incoming.origin.partition,
            incoming.origin.offset,
            stage,
            type(error).__name__,
        )
        await self._release(incoming)

    async def _publish_failed(
        self, incoming: Incoming, error: PublishError, request_id: str | None
    ) -> None:
        await self._dead_letter(incoming, error, self.settings.retry.max_attempts, request_id)

    async def _release(self, incoming: Incoming) -> None:
        origin = incoming.origin
        self._inflight[incoming.lane].release()
        for token in self.watermark.done((origin.topic, origin.partition), origin.offset):
            await self._ack(token)

    def forget_partition(self, topic: str, partition: int) -> None:
        """Stop tracking a revoked partition's offsets; their records get redelivered."""
        dropped = self.watermark.forget((topic, partition))
        if dropped:
            log.info("partition %s[%d] revoked with %d inputs in flight", topic, partition, dropped)

    # -- lifecycle ------------------------------------------------------------

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("pipeline task failed", exc_info=task.exception())

    async def close(self, timeout_s: float = 10.0) -> None:
        """Let in-flight work finish for up to ``timeout_s``, then cancel the rest."""
        if self._tasks:
            _done, pending = await asyncio.wait(set(self._tasks), timeout=timeout_s)
            for task in pending:
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.gather(*pending, return_exceptions=True)
