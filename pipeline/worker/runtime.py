"""The worker's core, free of Faust: intake → dedupe → scheduler → model → answers.

Every input that :meth:`Runtime.take` takes on ends
in exactly one result or one dead letter (see :mod:`pipeline.worker.answers`
for the order of publish, ack, store and release). Between intake and the
model, three levels of dedupe: a stored result, a computation already in
flight, a twin in the same batch, all owned by :mod:`pipeline.worker.repeats`
(asked here at intake, and again by :mod:`pipeline.worker.compute` when the
batch is formed).

Faust is reached only through injected callables: the producer's send (in
the publisher), the table the stored results live in, and ``ack`` for a
released input.

A lane takes no record while it is paused (its queue at its bound, or load
shedding), while work its full queue refused is parked, or while it holds as
many inputs as its bounds allow (:meth:`Runtime.has_room`); whoever feeds the
runtime is told when that may have changed (``on_room``). The lane reader
then leaves the lane's records in its buffer, which stops the partitions'
fetching once full. (faust-streaming 0.15.3's ``Consumer.pause_partitions``
is not used: it drops records already fetched for a paused partition, which
then only come back after a restart.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pipeline.codecs.keys import InputKeys
from pipeline.errors import ExpiredError, PermanentError
from pipeline.inference import InferenceEngine
from pipeline.observability.metrics import PipelineMetrics
from pipeline.scheduling import Controller, Item, Plan, Scheduler
from pipeline.settings import LANES, Settings
from pipeline.worker.answers import AckFn, Answer, Answers
from pipeline.worker.compute import Compute
from pipeline.worker.dedupe import StoredResults
from pipeline.worker.gates import LaneGates
from pipeline.worker.guard import Guard
from pipeline.worker.intake import parse
from pipeline.worker.publish import Publisher
from pipeline.worker.records import Incoming, Work
from pipeline.worker.repeats import Known, Repeats, StoreFn
from pipeline.worker.writer_schemas import WriterSchemas

__all__ = ["Runtime", "wall_ms"]

log = logging.getLogger(__name__)


def wall_ms() -> int:
    return int(time.time() * 1000)


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
        metrics: PipelineMetrics | None = None,
        fallback: InferenceEngine | None = None,
        fallback_model: tuple[str, str] | None = None,
        clock_ms: Callable[[], int] = wall_ms,
        forget: Callable[[list[Any]], None] | None = None,
        keys: Callable[[str], str] | None = None,
        on_room: Callable[[], None] | None = None,
        utilisation: Callable[[], float | None] | None = None,
        schemas: WriterSchemas | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        # What the controller grows the budget on: NVML's reading on a GPU (the app's
        # ``device_utilisation``); the inference thread's busy fraction otherwise.
        self._utilisation = utilisation or engine.busy_fraction
        self.repeats = Repeats(
            stored if settings.dedupe.enabled else None, in_partition=store_in_context
        )
        self.metrics = metrics or PipelineMetrics(process_collectors=False)
        #: Writer schemas of registry-framed records: the lane reader has each record's
        #: looked up (``wanted``, ``look_up``) before :meth:`take` decodes it.
        self.schemas = schemas or WriterSchemas(settings.registry, self.metrics)
        self._clock_ms = clock_ms
        self.model_id = settings.model.model_id
        # Dedupe keys (the model's ``keys``); without them texts dedupe only when equal.
        self.keys: Callable[[str], str] = keys or InputKeys(self.model_id)
        self.controller = Controller(
            settings.scheduler, slo_ms=settings.worker.lane_deadline_ms("realtime")
        )
        self.scheduler: Scheduler[Work] = Scheduler(
            settings.scheduler,
            expire_lanes=frozenset(lane for lane in LANES if settings.worker.expires(lane)),
            controller=self.controller,
            accelerated=engine.overlaps,
        )
        self.gates: LaneGates[Work] = LaneGates(
            self.scheduler,
            self.metrics,
            shed_lanes=lambda: self.guard.actions.paused_lanes,
            on_room=on_room,
        )
        self.guard = Guard(
            settings, scheduler=self.scheduler, metrics=self.metrics, on_shed=self.gates.apply
        )
        self.answers = Answers(
            settings,
            publisher=publisher,
            ack=ack,
            metrics=self.metrics,
            guard=self.guard,
            clock_ms=clock_ms,
            repeats=self.repeats,
            on_room=self.gates.room_freed,
        )
        self.compute = Compute(
            settings,
            engine=engine,
            answers=self.answers,
            guard=self.guard,
            scheduler=self.scheduler,
            metrics=self.metrics,
            repeats=self.repeats,
            fallback=fallback,
            fallback_model=fallback_model,
            clock_ms=clock_ms,
            spawn=self._spawn,
            answer_known=self._answer_known,
        )
        self._lane_deadline_ms = {lane: settings.worker.lane_deadline_ms(lane) for lane in LANES}
        self._max_tokens = settings.model.max_length
        self._wake = asyncio.Event()
        # A batch is formed at the last moment (late realtime requests get in and
        # the deadline predictions stay true): with a hand-over lead, when the
        # running one is predicted to end within it, so the engine tokenises the
        # next meanwhile (two in the engine at most); without, or where the engine
        # gains nothing from it (a CPU), after it ended.
        overlap = settings.scheduler.handover_ms >= 0 and engine.overlaps
        self._batch_slots = asyncio.Semaphore(2 if overlap else 1)
        self._inflight_ms: dict[int, float] = {}  # predicted run time per batch in the engine
        self._engine_free_ms = 0.0  # when the engine is predicted to have run them all
        self._batch_done = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        # Giving up on a rebalance: tokens Faust must stop waiting for go to ``forget``;
        # work parked for room in a full lane queue is unstarted too.
        self._forget = forget or (lambda tokens: None)
        self._budget_changes = (0.0, 0.0)

    @property
    def counters(self) -> dict[str, int]:
        return self.answers.counters

    # -- intake ---------------------------------------------------------------

    def has_room(self, lane: str, size: int) -> bool:
        """Whether :meth:`take` may take a record of ``lane`` with ``size`` bytes now: the
        lane is not paused, none of its work waits for queue room, and it holds few
        enough inputs (records and bytes)."""
        return self.gates.open(lane) and self.answers.has_room(lane, size)

    def take(self, incoming: Incoming) -> bool:
        """Take one consumed record on, at once (the caller asked :meth:`has_room`):
        decode and validate it, answer it if its result is known, else queue it for a batch.
        False when its partition was given up by a rebalance (:meth:`give_up_unstarted`):
        the record was not taken on, and the caller must tell Faust not to wait for it.

        Must be called in offset order per partition.
        """
        if not self.answers.accept(incoming):
            return False
        now = self._clock_ms()
        try:
            request = parse(
                incoming.origin.value,
                lane=incoming.lane,
                lane_deadline_ms=self._lane_deadline_ms[incoming.lane],
                model_id=self.model_id,
                limits=self.settings.validation,
                received_at_ms=now,
                keys=self.keys,
                writer_of=self.schemas.writer,
            )
        except PermanentError as exc:
            rid = getattr(exc, "request_id", None)
            self._spawn(self.answers.dead_letter(incoming, exc, 1, rid))
            return True
        work = Work(incoming=incoming, request=request, arrived_ms=now)
        # Every partition's store this worker holds: a text can be stored under another
        # partition's input (the key partitions by the exact text, dedupe is looser).
        known = self.repeats.recall(work)
        if known is None:
            self._offer(work)
        elif (answer := self._answer_known(work, known)) is not None:
            self._spawn(self.answers.results([answer]))
        return True

    def _answer_known(self, work: Work, known: Known) -> Answer | None:
        """Answer ``work`` from a stored result (a task of its own), or return the
        result computed here and not yet stored, for the caller to publish."""
        if known.prediction is not None and known.leader is not None:
            work.served = "inflight"  # computed here, not stored yet: from memory
            return (work, known.leader, known.prediction)
        if known.stored is not None:
            self._spawn(self._serve_stored(work, known.stored))
        return None

    async def _serve_stored(self, work: Work, stored: bytes) -> None:
        if not await self.answers.from_store(work.incoming, work.request, stored):
            work.stored_unusable = True  # unreadable or another version's: compute afresh
            self._offer(work)

    def _offer(self, work: Work) -> None:
        """Hand work to the scheduler, through its lane's gate (parked while it is full)."""
        req = work.request
        # A cheap estimate (about four characters per token) is enough to bucket by length.
        tokens = min(self._max_tokens, len(req.text) // 4 + 2)
        deadline = self.guard.deadline_ms(
            req.lane, arrived_ms=work.arrived_ms, deadline_ms=req.deadline_ms
        )
        self.gates.offer(Item(work, req.lane, deadline, work.arrived_ms, tokens))
        self._wake.set()

    # -- batches --------------------------------------------------------------

    async def run(self) -> None:
        """Ask the scheduler for batches forever, each formed at the last moment.

        That moment is when the running batch is predicted (by the latency
        model) to end within the engine's measured tokenisation time plus
        ``scheduler.handover_ms``: the next one is tokenised while it runs.
        """
        while True:
            await self._batch_slots.acquire()
            await self._until_handover()
            plan = await self._next_plan()
            now = self._clock_ms()
            self._inflight_ms[id(plan)] = plan.predicted_ms
            self._engine_free_ms = max(float(now), self._engine_free_ms) + plan.predicted_ms
            task = self._spawn(self._run_plan(plan))
            task.add_done_callback(lambda _t: self._batch_slots.release())

    async def _until_handover(self) -> None:
        """Wait while batches in the engine are predicted to run longer than the lead."""
        while self._inflight_ms:
            lead = self.settings.scheduler.handover_ms + (self.engine.tokenize_ms() or 0.0)
            wait_ms = self._engine_free_ms - lead - self._clock_ms()
            if wait_ms <= 0:
                return
            self._batch_done.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._batch_done.wait(), wait_ms / 1000)

    def _batch_finished(self, plan: Plan[Work]) -> None:
        # The engine runs batches in order: the next one starts about now.
        self._inflight_ms.pop(id(plan), None)
        self._engine_free_ms = self._clock_ms() + sum(self._inflight_ms.values())
        self._batch_done.set()

    async def _next_plan(self) -> Plan[Work]:
        """Wait until the scheduler has a batch to run; dead-letter what it expired."""
        while True:
            now = self._clock_ms()
            self._wake.clear()
            # Batches still in the engine run first: the scheduler counts from their end.
            plan = self.scheduler.next_batch(now, engine_free_ms=self._engine_free_ms)
            if plan is not None:
                self.gates.apply()
                for item in plan.expired:
                    req = item.payload.request
                    late = now - req.deadline_ms
                    trip = item.payload.arrived_ms - req.created_at_ms
                    error = ExpiredError(
                        f"cannot meet its deadline ({req.lane}; {late:+d} ms past it now; "
                        f"reached the worker {trip} ms after it was made, waited "
                        f"{now - item.payload.arrived_ms} ms here)"
                    )
                    self._spawn(
                        self.answers.dead_letter(item.payload.incoming, error, 1, req.request_id)
                    )
                if plan.items:
                    return plan
                continue
            wait = self.scheduler.wait_ms(now, engine_free_ms=self._engine_free_ms)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), None if wait is None else wait / 1000)

    async def _run_plan(self, plan: Plan[Work]) -> None:
        batch = [item.payload for item in plan.items]
        start = self._clock_ms()
        try:
            ran = await self.compute.run_batch(batch, shape=(plan.seq_len, plan.batch_shape))
        finally:
            self._batch_finished(plan)
        latency_ms = ran.ms if ran is not None else float(self._clock_ms() - start)
        self.scheduler.observe(
            plan,
            latency_ms=latency_ms,
            utilisation=self._utilisation(),
            now_ms=self._clock_ms(),
        )
        m = self.metrics
        # Tokens as the model computed them; the scheduler's bucketed plan is in its snapshot.
        real, padded = (ran.real_tokens, ran.padded_tokens) if ran is not None else (0, 0)
        m.batch(len(plan.items), real, padded, latency_ms / 1000, plan.reason)
        snap = self.scheduler.snapshot()
        m.budget(int(snap.get("budget", plan.budget)))
        grows, shrinks = snap.get("budget_grows", 0.0), snap.get("budget_shrinks", 0.0)
        if grows > self._budget_changes[0]:
            m.budget_change("grow")
        if shrinks > self._budget_changes[1]:
            m.budget_change("shrink")
        self._budget_changes = (grows, shrinks)

    def give_up_unstarted(self) -> int:
        """A rebalance starts: abandon work the model has not started (queued in the
        scheduler, parked for room, or waiting at a paused lane's gate), so the revoke
        waits only for running batches and answers being published. Abandoned offsets
        stay uncommitted; the partition's next owner reads them again. Returns how
        many inputs were abandoned."""
        entries = list(self.scheduler.queues.all_entries())
        self.scheduler.queues.remove(entries)
        unstarted = [e.item.payload for e in entries] + self.gates.give_up()
        stranded = self.answers.give_up([work.incoming for work in unstarted])
        self._forget(stranded)
        self.gates.apply()
        if unstarted:
            log.info(
                "rebalance: %d inputs not yet started given up (read again by the "
                "partitions' next owners); %d more wait behind them",
                len(unstarted),
                max(0, len(stranded) - len(unstarted)),
            )
        return len(unstarted)

    def forget_partition(self, topic: str, partition: int) -> None:
        """Stop tracking a revoked partition's offsets; their records get redelivered."""
        self.answers.forget_partition(topic, partition)

    async def housekeeping(self, interval_s: float = 1.0) -> None:
        """Once a second: let shedding recover on a quiet lane; refresh the gauges."""
        while True:
            await asyncio.sleep(interval_s)
            self.guard.tick(self._clock_ms())
            self.gates.apply()
            for lane in LANES:
                self.metrics.queue_depth(lane, self.scheduler.depth(lane))
            self.metrics.inflight(self.answers.inflight_count())
            self.metrics.oldest_unreleased(self.answers.oldest_unreleased_ms() / 1000)
            self.metrics.busy_fraction(self.engine.busy_fraction())

    # -- lifecycle ------------------------------------------------------------

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        """An exception that escapes a task may leave an input unanswered: never hold
        it silently, stop the worker loudly (``Publisher.fail``; redelivered)."""
        self._tasks.discard(task)
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            log.error("pipeline task failed", exc_info=exc)
            self.answers.publisher.fail(exc)

    async def close(self, timeout_s: float = 10.0) -> None:
        """Let in-flight work finish for up to ``timeout_s``, then cancel the rest."""
        self.schemas.close()
        if self._tasks:
            _done, pending = await asyncio.wait(set(self._tasks), timeout=timeout_s)
            for task in pending:
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.gather(*pending, return_exceptions=True)
