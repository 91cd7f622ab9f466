"""Answering requests: results and dead letters out, then the input released.

Every accepted input gets exactly one answer through this module, in this
order (docs/design.md, delivery rules):

    publish result/dead letter → await broker ack → store dedupe entry → release offset

Releasing hands the input's offset to admission's per-partition watermark
(:mod:`pipeline.worker.admission`, which also bounds each lane), which acks
to Faust only a contiguous prefix. Each answer also feeds the metrics and the
load shedder (realtime lateness).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from pipeline.codecs.avro import result_codec
from pipeline.errors import AnswerPathFailure, PermanentError, PublishRejected, stage_of
from pipeline.inference import Prediction
from pipeline.observability.metrics import PipelineMetrics
from pipeline.settings import LANES, Settings
from pipeline.worker.admission import Admission, LaneBounds
from pipeline.worker.guard import Guard
from pipeline.worker.publish import Publisher, dead_letter_record, result_record
from pipeline.worker.records import Incoming, Request, Work, record_size
from pipeline.worker.repeats import Repeats

__all__ = ["Answers"]

log = logging.getLogger(__name__)

AckFn = Callable[[Any], Awaitable[None]]
#: One result to publish: (work, the leader that computed it, its prediction).
Answer = tuple[Work, Work, Prediction]


class Answers:
    """Publishes one answer per input and releases it (see the module's promise)."""

    def __init__(
        self,
        settings: Settings,
        *,
        publisher: Publisher,
        ack: AckFn,
        metrics: PipelineMetrics,
        guard: Guard,
        clock_ms: Callable[[], int],
        repeats: Repeats | None = None,
        on_room: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.publisher = publisher
        self.metrics = metrics
        self.guard = guard
        self.repeats = repeats or Repeats(None)
        self._ack = ack
        self._clock_ms = clock_ms
        # Per lane, so a flooded bulk lane never blocks realtime intake.
        self.admission: Admission[Any] = Admission(
            LANES,
            LaneBounds(settings.batch.max_inflight, settings.batch.max_inflight_bytes),
            clock_ms=clock_ms,
            on_room=on_room,
        )
        self.counters: dict[str, int] = dict.fromkeys(
            ["received", "results", "dead_letters", "stored", "inflight", "batch", "computed"], 0
        )

    def has_room(self, lane: str, size: int) -> bool:
        """Whether ``lane`` holds few enough inputs (records and bytes) to take one more
        of ``size`` bytes."""
        return self.admission.has_room(lane, size)

    def accept(self, incoming: Incoming) -> bool:
        """Take an input on and track its offset (the caller asked :meth:`has_room`).
        False when its partition was given up by a rebalance: the input is not this
        worker's to answer any more."""
        origin = incoming.origin
        size = record_size(origin)
        tp = (origin.topic, origin.partition)
        if not self.admission.hold(incoming.lane, tp, origin.offset, size, incoming.token):
            return False
        self.counters["received"] += 1
        self.metrics.arrived(incoming.lane)
        return True

    def give_up(self, unstarted: list[Incoming]) -> list[Any]:
        """Abandon ``unstarted`` inputs (a rebalance starts): they are never answered
        here; return the tokens Faust must stop waiting for (see Admission.give_up)."""
        return self.admission.give_up(
            ((i.origin.topic, i.origin.partition), i.origin.offset) for i in unstarted
        )

    def inflight_count(self) -> int:
        """Inputs accepted but not yet released, over every lane."""
        return self.admission.pending()

    def oldest_unreleased_ms(self) -> int:
        """How long the oldest input accepted and not yet answered has waited (0: none)."""
        return self.admission.oldest_ms()

    async def results(self, answers: list[Answer]) -> None:
        """Publish a batch's results, each ``(work, leader, prediction)``: all are handed
        to the producer first, then each acknowledgement is awaited in turn, the leader
        of a computation stores its result (:meth:`Repeats.remember`), and the input is
        released. One task for the batch, not one per input: a noop worker spent about a
        tenth of its time making and running those.
        """
        begun: list[tuple[Answer, bytes, Coroutine[Any, Any, None] | None, Exception | None]]
        begun = []
        for answer in answers:
            work, leader, prediction = answer
            key = work.request.content_hash.encode("ascii")
            try:
                value, sent = self.publisher.result_begin(
                    key, self._record(work, leader, prediction)
                )
            except PublishRejected as exc:  # surely not written
                begun.append((answer, b"", None, exc))
                continue
            begun.append((answer, value, sent, None))
        failure: Exception | None = None
        for i, (answer, value, acked, rejected) in enumerate(begun):
            try:
                await self._finish(answer, value, acked, rejected)
            except asyncio.CancelledError:
                for later, _value, left, _rejected in begun[i + 1 :]:
                    if left is not None:
                        left.close()  # never awaited: the worker is stopping
                    if later[0] is later[1]:
                        self.repeats.forget(later[1])
                raise
            except Exception as exc:  # the answer path failed: the others still get theirs
                failure = failure or exc
        if failure is not None:
            raise failure

    def _record(self, work: Work, leader: Work, prediction: Prediction) -> dict[str, Any]:
        name, version = (
            work.model
            or leader.model
            or (
                self.settings.model.display_name,
                self.settings.model.version,
            )
        )
        return result_record(
            work.request,
            prediction,
            model_name=name,
            model_version=version,
            task=self.settings.model.task,
            served=work.served,
            completed_at_ms=self._clock_ms(),
            queue_ms=work.queue_ms,
            inference_ms=leader.stats.get("inference_ms", 0.0),
            batch_size=int(leader.stats.get("batch_size", 0)),
        )

    async def _finish(
        self,
        answer: Answer,
        value: bytes,
        acked: Coroutine[Any, Any, None] | None,
        rejected: Exception | None,
    ) -> None:
        """Await one result's acknowledgement; then store (the leader) and release it."""
        work, leader, _prediction = answer
        try:
            if rejected is not None:
                raise rejected
            assert acked is not None
            await acked
        except PublishRejected as exc:  # surely not written
            if work is leader:
                self.repeats.forget(leader)
            await self.dead_letter(work.incoming, exc, 1, work.request.request_id)
            return
        except BaseException:  # AnswerPathFailure: the worker is stopping; release nothing
            if work is leader:
                self.repeats.forget(leader)
            raise
        if work is leader:
            try:
                self.repeats.remember(leader, value)
            except Exception as exc:
                # The result is out, but the store is broken (a full disk, say): stop the
                # worker loudly with the input unreleased; it is delivered again after a
                # restart (and answered again: at-least-once).
                origin = work.incoming.origin
                raise self.publisher.fail(
                    AnswerPathFailure(
                        f"cannot store the dedupe entry for {origin.topic}[{origin.partition}]"
                        f"@{origin.offset} ({type(exc).__name__}: {exc}); free the store's "
                        "disk and restart the worker"
                    )
                ) from exc
        await self._answered(work.incoming, work.request, work.served)

    async def from_store(self, incoming: Incoming, request: Request, stored: bytes) -> bool:
        """Publish a stored result for ``request``; False when it is unusable (recompute)."""
        try:
            record = result_codec().decode(stored)
        except PermanentError:
            return False
        if record["model_version"] != self.settings.model.version:
            return False
        record = {
            **record,
            "request_id": request.request_id,
            "content_hash": request.content_hash,  # the stored text may differ (e.g. case)
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
        except PublishRejected as exc:  # surely not written
            await self.dead_letter(incoming, exc, 1, request.request_id)
            return True
        await self._answered(incoming, request, "stored")
        return True

    async def dead_letter(
        self, incoming: Incoming, error: BaseException, attempts: int, request_id: str | None
    ) -> None:
        """Publish a dead letter for the input (see ``dead_letter_record``), then release it.

        If the dead letter is not acknowledged, AnswerPathFailure is raised and the
        worker stops (``Publisher.fail``): the input stays unreleased, its offset is
        never committed, so it is delivered again after the restart.
        """
        stage = stage_of(error)
        origin = incoming.origin
        record = dead_letter_record(
            origin,
            stage=stage,
            error=error,
            attempts=max(1, attempts),
            failed_at_ms=self._clock_ms(),
            request_id=request_id,
        )
        await self.publisher.dead_letter(record)
        self.counters["dead_letters"] += 1
        self.metrics.dead_letter(stage, incoming.lane)
        if stage == "expired":
            self.guard.answered(self._clock_ms(), incoming.lane, late=True)
        log.info(
            "dead letter: %s[%d]@%d stage=%s %s",
            origin.topic,
            origin.partition,
            origin.offset,
            stage,
            type(error).__name__,
            extra={
                "stage": stage,
                "error_class": type(error).__name__,
                "topic": origin.topic,
                "partition": origin.partition,
                "offset": origin.offset,
                "request_id": request_id,
            },
        )
        await self._release(incoming)

    async def _answered(self, incoming: Incoming, request: Request, served: str) -> None:
        done = self._clock_ms()
        late = done > request.deadline_ms
        self.counters["results"] += 1
        self.counters[served] += 1
        self.metrics.completed(
            request.lane, served, (done - request.created_at_ms) / 1000, late=late
        )
        self.guard.answered(done, request.lane, late=late)
        await self._release(incoming)

    async def _release(self, incoming: Incoming) -> None:
        origin = incoming.origin
        for token in self.admission.release((origin.topic, origin.partition), origin.offset):
            await self._ack(token)

    def forget_partition(self, topic: str, partition: int) -> None:
        """Stop tracking a revoked partition's offsets; their records get redelivered."""
        dropped = self.admission.forget((topic, partition))
        self.metrics.forget_partition(topic, partition)
        if dropped:
            log.info(
                "partition %s[%d] revoked or rewound: %d inputs in flight will be redelivered",
                topic,
                partition,
                dropped,
            )
