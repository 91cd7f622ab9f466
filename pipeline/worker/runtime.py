"""The worker's core, free of Faust: intake → dedupe → scheduler → model → answers.

Every input that :meth:`Runtime.take` takes on ends
in exactly one result or one dead letter (see :mod:`pipeline.worker.answers`
for the order of publish, ack, store and release). Between intake and the
model, three levels of dedupe: a stored result, a computation already in
flight, a twin in the same batch, all owned by :mod:`pipeline.worker.repeats`
(asked here at intake, and again by :mod:`pipeline.worker.compute` when the
batch is formed).

The runtime owns the worker's state between the stages: the ledger of held
offsets (:mod:`pipeline.worker.ledger`), the deadlines
(:mod:`pipeline.scheduling.deadlines`), dedupe (:mod:`pipeline.worker.repeats`).
A stage hands its output forward; what must go back against the flow is an
event (:mod:`pipeline.worker.events`) that :meth:`Runtime.dispatch` routes.

Faust is reached only through injected callables: the producer's send (in
the publisher), the table the stored results live in, ``ack`` for a
released input, the ledger's consumer hooks, and ``on_failure``, which stops
the worker.

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
from pipeline.errors import PermanentError
from pipeline.inference import InferenceEngine
from pipeline.observability.metrics import PipelineMetrics
from pipeline.scheduling import Controller, Scheduler
from pipeline.scheduling.deadlines import Deadlines
from pipeline.scheduling.degrade import Shedding
from pipeline.scheduling.tokens import estimate_tokens
from pipeline.settings import LANES, Settings, lanes_of
from pipeline.worker.answers import AckFn, Answers
from pipeline.worker.batches import BatchLoop
from pipeline.worker.compute import Compute
from pipeline.worker.dedupe import StoredResults
from pipeline.worker.events import (
    Acked,
    Answered,
    AnswerPathFailed,
    Event,
    Recompute,
    RoomFreed,
    Unstored,
)
from pipeline.worker.gates import LaneGates
from pipeline.worker.guard import Guard
from pipeline.worker.intake import parse
from pipeline.worker.ledger import Ledger
from pipeline.worker.publish import Publisher
from pipeline.worker.records import Incoming, Work
from pipeline.worker.repeats import Repeats, StoreFn
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
        ledger: Ledger | None = None,
        stored: StoredResults | None = None,
        store_in_context: StoreFn | None = None,
        metrics: PipelineMetrics | None = None,
        fallback: InferenceEngine | None = None,
        fallback_model: tuple[str, str] | None = None,
        clock_ms: Callable[[], int] = wall_ms,
        keys: Callable[[str], str] | None = None,
        lengths: Callable[[str, int], int] | None = None,
        on_room: Callable[[], None] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        utilisation: Callable[[], float | None] | None = None,
        schemas: WriterSchemas | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        #: The one keeper of held offsets and lane bounds (made here when not given:
        #: the app makes it first, as records are buffered from the first assignment).
        self.ledger = ledger or Ledger(settings, {}, clock_ms=clock_ms)
        self.ledger.on_room = lambda: self.dispatch(RoomFreed())
        self._on_room = on_room or (lambda: None)
        self._on_failure = on_failure or (lambda failure: None)
        if publisher.on_fatal is None:
            publisher.on_fatal = lambda failure: self.dispatch(AnswerPathFailed(failure))
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
        # Tokens a text will be, capped (the tokenizer's exact count, codecs.lengths);
        # without a tokenizer, the estimate (scheduling.tokens: words and pieces).
        self._lengths: Callable[[str, int], int] = lengths or estimate_tokens
        lanes = lanes_of(settings)
        # The latency objective: the top lane's deadline.
        self.controller = Controller(settings.scheduler, slo_ms=lanes[0].deadline_ms)
        #: The one owner of every request's deadline; shedding changes it through ``shed``.
        self.deadlines = Deadlines(lanes)
        self.scheduler: Scheduler[Work] = Scheduler(
            settings.scheduler,
            expires=self.deadlines.expires,
            controller=self.controller,
            accelerated=engine.overlaps,
        )
        self.guard = Guard(settings, metrics=self.metrics)
        self.gates: LaneGates[Work] = LaneGates(
            self.scheduler,
            self.metrics,
            shed_lanes=lambda: self.guard.actions.paused_lanes,
            on_room=lambda: self.dispatch(RoomFreed()),
        )
        self.answers = Answers(
            settings,
            publisher=publisher,
            ack=ack,
            metrics=self.metrics,
            ledger=self.ledger,
            emit=self.dispatch,
            spawn=self._spawn,
            clock_ms=clock_ms,
        )
        self.compute = Compute(
            settings,
            engine=engine,
            answers=self.answers,
            guard=self.guard,
            metrics=self.metrics,
            repeats=self.repeats,
            fallback=fallback,
            fallback_model=fallback_model,
            clock_ms=clock_ms,
            spawn=self._spawn,
        )
        self.batches = BatchLoop(
            settings,
            engine=engine,
            scheduler=self.scheduler,
            gates=self.gates,
            compute=self.compute,
            answers=self.answers,
            metrics=self.metrics,
            clock_ms=clock_ms,
            spawn=self._spawn,
            utilisation=self._utilisation,
        )
        self._max_tokens = settings.model.max_length
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def counters(self) -> dict[str, int]:
        return self.answers.counters

    # -- events -----------------------------------------------------------------

    def dispatch(self, event: Event) -> None:
        """Route a signal against the flow to whoever reacts to it (pipeline.worker.events);
        synchronous: what the reaction raises reaches the emitter."""
        match event:
            case RoomFreed():
                self._on_room()
            case Answered(lane=lane, at_ms=at_ms, late=late):
                self._shed(self.guard.answered(at_ms, lane, late=late))
            case Acked(leader=leader, value=value):
                self.repeats.remember(leader, value)
            case Unstored(leader=leader):
                self.repeats.forget(leader)
            case Recompute(work=work):
                self._offer(work)
            case AnswerPathFailed(failure=failure):
                self._on_failure(failure)

    def _shed(self, shedding: Shedding | None) -> None:
        """Load shedding changed its actions: deadlines and lane gates follow them."""
        if shedding is not None:
            self.deadlines.shed(shedding)
            self.gates.apply()

    # -- intake ---------------------------------------------------------------

    def has_room(self, lane: str, size: int) -> bool:
        """Whether :meth:`take` may take a record of ``lane`` with ``size`` bytes now: the
        lane is not paused, none of its work waits for queue room, and it holds few
        enough inputs (records and bytes)."""
        return self.gates.open(lane) and self.ledger.has_room(lane, size)

    def take(self, incoming: Incoming) -> bool:
        """Take one consumed record on, at once (the caller asked :meth:`has_room`):
        decode and validate it, answer it if its result is known, else queue it for a batch.
        False when its partition was given up by a rebalance (:meth:`give_up_unstarted`):
        the record was not taken on, and the caller must tell Faust not to wait for it.

        Must be called in offset order per partition.
        """
        if not self.ledger.hold(incoming):
            return False
        self.answers.arrived(incoming)
        now = self._clock_ms()
        try:
            request = parse(
                incoming.origin.value,
                lane=incoming.lane,
                lane_deadline_ms=self.deadlines.lane_ms(incoming.lane),
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
        elif (answer := self.answers.known(work, known)) is not None:
            self._spawn(self.answers.results([answer]))
        return True

    def _offer(self, work: Work) -> None:
        """Hand work to the scheduler, through its lane's gate (parked while it is full)."""
        req = work.request
        work.tokens = self._lengths(req.text, self._max_tokens)
        work.deadline_ms = self.deadlines.schedule_by(
            req.lane, arrived_ms=work.arrived_ms, deadline_ms=req.deadline_ms
        )
        self.gates.offer(work)
        self.batches.wake()

    # -- batches --------------------------------------------------------------

    async def run(self) -> None:
        """Form and run batches for as long as the worker runs (:class:`BatchLoop`)."""
        await self.batches.run()

    def give_up_unstarted(self, why: str = "rebalance") -> int:
        """A rebalance starts (or the worker stops: ``why``): abandon work the model has
        not started (queued in the scheduler, parked for room, or waiting at a paused
        lane's gate) and every buffered record, so the revoke waits only for running
        batches and answers being published. Abandoned offsets stay uncommitted; the
        partition's next owner reads them again. Returns how many inputs were abandoned."""
        entries = list(self.scheduler.queues.all_entries())
        self.scheduler.queues.remove(entries)
        unstarted = [e.item for e in entries] + self.gates.give_up()
        stranded, dropped = self.ledger.give_up([work.incoming for work in unstarted])
        self.gates.apply()
        if unstarted:
            log.info(
                "%s: %d inputs not yet started given up (read again by the "
                "partitions' next owners); %d more wait behind them",
                why,
                len(unstarted),
                max(0, stranded - len(unstarted)),
            )
        if dropped:
            log.info("%s: %d buffered lane records dropped (read again after it)", why, dropped)
        return len(unstarted)

    def revoked(self, tps: list[Any]) -> None:
        """Partitions were revoked: the ledger forgets them (their records are
        redelivered to the next owner), and so do the metrics."""
        held = self.ledger.revoked(tps)
        for tp in tps:
            self.metrics.forget_partition(tp[0], tp[1])
        if held:
            log.info("partitions revoked or rewound: %d inputs in flight will be redelivered", held)

    async def housekeeping(self, interval_s: float = 1.0) -> None:
        """Once a second: let shedding recover on a quiet lane; refresh the gauges."""
        while True:
            await asyncio.sleep(interval_s)
            self._shed(self.guard.tick(self._clock_ms()))
            self.gates.apply()
            for lane in LANES:
                self.metrics.queue_depth(lane, self.scheduler.depth(lane))
            self.metrics.inflight(self.ledger.pending())
            self.metrics.oldest_unreleased(self.ledger.oldest_ms() / 1000)
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
