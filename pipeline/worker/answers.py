"""Answering requests: results and dead letters out, then the input released.

Every accepted input gets exactly one answer through this module, in this
order (docs/design.md, delivery rules):

    publish result/dead letter → await broker ack → store dedupe entry → release offset

Releasing hands the input's offset back to the runtime's ledger
(:mod:`pipeline.worker.ledger`), whose per-partition watermark acks to Faust
only a contiguous prefix. What earlier stages must hear of an answer (its
lateness, for load shedding; a leader's result to store, or not; a stored
result found unusable) is emitted as an event (:mod:`pipeline.worker.events`),
never called back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from pipeline.codecs.avro import result_codec
from pipeline.errors import AnswerPathFailure, PermanentError, PublishRejected, stage_of
from pipeline.observability.logs import Tally
from pipeline.observability.metrics import PipelineMetrics
from pipeline.settings import Settings
from pipeline.worker.events import Acked, Answered, Emit, Recompute, Unstored
from pipeline.worker.ledger import Ledger
from pipeline.worker.publish import Publisher, dead_letter_record, result_record
from pipeline.worker.records import Incoming, Request, Work
from pipeline.worker.repeats import Known

__all__ = ["Answers"]

log = logging.getLogger(__name__)

#: At most one log line per this many seconds for expired requests' dead letters.
EXPIRED_LOG_S = 10.0

AckFn = Callable[[Any], Awaitable[None]]


class Answers:
    """Publishes one answer per input and releases it (see the module's promise)."""

    def __init__(
        self,
        settings: Settings,
        *,
        publisher: Publisher,
        ack: AckFn,
        metrics: PipelineMetrics,
        ledger: Ledger,
        emit: Emit,
        spawn: Callable[[Awaitable[Any]], Any],
        clock_ms: Callable[[], int],
    ) -> None:
        self.settings = settings
        self.publisher = publisher
        self.metrics = metrics
        self._ledger = ledger
        self._emit = emit
        self._spawn = spawn
        self._ack = ack
        self._clock_ms = clock_ms
        #: The configured model's (name, version), named in results computed by it.
        self._model = (settings.model.display_name, settings.model.version)
        #: Stored results found, waiting for the task that serves them (:meth:`known`).
        self._stored: list[tuple[Work, bytes]] = []
        self._expired = Tally(EXPIRED_LOG_S)
        self._expired_flush: asyncio.TimerHandle | None = None
        self.counters: dict[str, int] = dict.fromkeys(
            ["received", "results", "dead_letters", "stored", "inflight", "batch", "computed"], 0
        )

    def arrived(self, incoming: Incoming) -> None:
        """Count an input taken on (the ledger holds it)."""
        self.counters["received"] += 1
        self.metrics.arrived(incoming.lane)

    def known(self, work: Work, found: Known) -> Work | None:
        """Answer ``work`` from a result known already: a stored one is published by a
        task of its own (or, unusable, the work is computed after all: ``Recompute``);
        one computed here and not yet stored is returned, for the caller to publish
        with its batch's."""
        if found.prediction is not None and found.leader is not None:
            work.served = "inflight"  # computed here, not stored yet: from memory
            return work.answered_by(found.leader, found.prediction)
        if found.stored is not None:
            self._stored.append((work, found.stored))
            if len(self._stored) == 1:  # the first since the task took them: one task for all
                self._spawn(self._serve_stored())
        return None

    async def results(self, answers: list[Work]) -> None:
        """Publish a batch's results, each a work with its ``prediction`` and ``leader``
        set (:meth:`Work.answered_by`): all are handed to the producer first, then each
        acknowledgement is awaited in turn, the leader of a computation has its result
        stored (the ``Acked`` event), and the input is released. One task for the batch,
        not one per input: a noop worker spent about a tenth of its time making and
        running those.
        """
        begun: list[tuple[Work, bytes, Coroutine[Any, Any, None] | None, Exception | None]]
        begun = []
        for work in answers:
            key = work.request.content_hash.encode("ascii")
            try:
                value, sent = self.publisher.result_begin(key, self._record(work))
            except PublishRejected as exc:  # surely not written
                begun.append((work, b"", None, exc))
                continue
            begun.append((work, value, sent, None))
        failure: Exception | None = None
        for i, (work, value, acked, rejected) in enumerate(begun):
            try:
                await self._finish(work, value, acked, rejected)
            except asyncio.CancelledError:
                for later, _value, left, _rejected in begun[i + 1 :]:
                    if left is not None:
                        left.close()  # never awaited: the worker is stopping
                    if later.leader is later:
                        self._emit(Unstored(later))
                raise
            except Exception as exc:  # the answer path failed: the others still get theirs
                failure = failure or exc
        if failure is not None:
            raise failure

    def _record(self, work: Work) -> dict[str, Any]:
        leader, prediction = work.leader, work.prediction
        assert leader is not None and prediction is not None
        name, version = work.model or leader.model or self._model
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
        work: Work,
        value: bytes,
        acked: Coroutine[Any, Any, None] | None,
        rejected: Exception | None,
    ) -> None:
        """Await one result's acknowledgement; then store (the leader) and release it."""
        leader = work.leader
        try:
            refused = await _refusal(acked, rejected)
        except BaseException:  # AnswerPathFailure: the worker is stopping; release nothing
            if work is leader:
                self._emit(Unstored(leader))
            raise
        if refused is not None:  # surely not written
            if work is leader:
                self._emit(Unstored(leader))
            await self.dead_letter(work.incoming, refused, 1, work.request.request_id)
            return
        if work is leader:
            try:
                self._emit(Acked(leader, value))  # stored before the input is released
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

    async def _serve_stored(self) -> None:
        """Publish the stored results found since this task was spawned (the rest of the
        lane reader's pass included; a task each cost a no-op worker 3 % of its event
        loop), all handed to the producer first, then each acknowledgement awaited and
        its input released. One unreadable or of another model version is computed
        afresh instead (``Recompute``)."""
        found, self._stored = self._stored, []
        begun: list[tuple[Work, Coroutine[Any, Any, None] | None, Exception | None]] = []
        for work, stored in found:
            record = self._stored_record(work, stored)
            if record is None:
                continue
            try:
                key = work.request.content_hash.encode("ascii")
                begun.append((work, self.publisher.result_begin(key, record)[1], None))
            except PublishRejected as exc:  # surely not written
                begun.append((work, None, exc))
        failure: Exception | None = None
        for i, (work, acked, rejected) in enumerate(begun):
            incoming, request = work.incoming, work.request
            try:
                refused = await _refusal(acked, rejected)
            except asyncio.CancelledError:
                for _work, left, _rejected in begun[i + 1 :]:
                    if left is not None:
                        left.close()  # never awaited: the worker is stopping
                raise
            except Exception as exc:  # the answer path failed: the others still get theirs
                failure = failure or exc
                continue
            if refused is not None:  # surely not written
                await self.dead_letter(incoming, refused, 1, request.request_id)
                continue
            await self._answered(incoming, request, "stored")
        if failure is not None:
            raise failure

    def _stored_record(self, work: Work, stored: bytes) -> dict[str, Any] | None:
        """The result to publish for ``work`` from a stored one; None (and ``Recompute``)
        when that is unreadable or of another model version."""
        try:
            record = result_codec().decode(stored, floats_as_bytes=True)  # copied as they are
        except PermanentError:
            record = None
        if record is None or record["model_version"] != self.settings.model.version:
            work.stored_unusable = True  # the store is not asked again for it
            self._emit(Recompute(work))
            return None
        request = work.request
        return {
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
            self._emit(Answered(incoming.lane, self._clock_ms(), late=True))
            # A flood under overload: one line per window, each letter at DEBUG.
            counts = self._expired.add(incoming.lane)
            if counts is not None:
                _log_expired(counts)
            elif self._expired_flush is None:  # the window's counts, logged at its end
                self._expired_flush = asyncio.get_running_loop().call_later(
                    self._expired.due_in() or 0.0, self._flush_expired
                )
        level = logging.DEBUG if stage == "expired" else logging.INFO
        if log.isEnabledFor(level):
            log.log(
                level,
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

    def _flush_expired(self) -> None:
        """Log the expired requests counted since the last line, once its window ends: a
        flood that stopped is not left unsummarised until the next expiry."""
        self._expired_flush = None
        counts = self._expired.flush()
        if counts is not None:
            _log_expired(counts)
            return
        due = self._expired.due_in()
        if due is not None:  # woken a hair before the window's end (the loop's resolution)
            self._expired_flush = asyncio.get_running_loop().call_later(due, self._flush_expired)

    async def _answered(self, incoming: Incoming, request: Request, served: str) -> None:
        done = self._clock_ms()
        late = done > request.deadline_ms
        self.counters["results"] += 1
        self.counters[served] += 1
        self.metrics.completed(
            request.lane, served, (done - request.created_at_ms) / 1000, late=late
        )
        self._emit(Answered(request.lane, done, late))
        await self._release(incoming)

    async def _release(self, incoming: Incoming) -> None:
        for token in self._ledger.release(incoming.origin):
            await self._ack(token)


def _log_expired(counts: dict[str, int]) -> None:
    log.info(
        "expired requests dead-lettered: %d (%s) since the last such line; "
        "each is in the dead-letter topic",
        sum(counts.values()),
        ", ".join(f"{lane} {n}" for lane, n in sorted(counts.items())),
        extra={"stage": "expired", "expired": counts},
    )


async def _refusal(
    acked: Coroutine[Any, Any, None] | None, rejected: Exception | None
) -> PublishRejected | None:
    """Await a result's acknowledgement (or take its refusal before it was sent, in
    ``rejected``): None once it is in, the refusal when it was surely not written;
    any other failure (``AnswerPathFailure``, a cancellation) raises."""
    try:
        if rejected is not None:
            raise rejected
        assert acked is not None
        await acked
    except PublishRejected as exc:
        return exc
    return None
