"""The lane reader: fetched lane records into the runtime, realtime first, in chunks.

Each fetch's lane records land in the ledger's buffer
(:class:`~pipeline.worker.ledger.Ledger`, ``fetched``) in one call, from the
consumer (:func:`pipeline.kafka.faust_edge.install`).
The reader takes them from there up to :data:`CHUNK` records a pass, looking
at the lanes in priority order on every pass, so a realtime record fetched
behind thousands of bulk ones waits for one chunk, not for the bulk backlog.
Between passes it yields to the event loop (the batch loop and the answers).

Per record, in offset order per partition: its partition's start offset must
be known (looked up once per assignment, :mod:`pipeline.worker.start_offsets`; the
partition's records wait meanwhile, the other partitions' do not), so must the
writer schema of a record in the Schema Registry's framing (looked up once per
id, :mod:`pipeline.worker.writer_schemas`; the same wait), the
record is checked against the next offset expected (:mod:`pipeline.worker.continuity`:
a hole is sought back for, a second copy passed over), and the runtime takes
it if its lane has room; a lane without room keeps its records buffered until
the runtime frees some (``wake``). A buffered lane over its bound stops its
partitions' fetching (the buffer's promise), which is how a paused or full
lane pushes back on the broker.

Faust is reached only through :class:`Consumer`, a few injected callables.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

from pipeline.settings import LANES
from pipeline.worker.continuity import Continuity
from pipeline.worker.lane_buffer import SKIP, STOP, TAKEN, LaneBuffer
from pipeline.worker.ledger import Ledger
from pipeline.worker.records import Incoming, Origin, record_size
from pipeline.worker.runtime import Runtime

__all__ = ["CHUNK", "Consumer", "LaneReader"]

log = logging.getLogger(__name__)

#: Most records taken in one pass before the reader yields and looks at realtime again.
CHUNK = 64


def _accepted(tp: Any, hole: tuple[int, int], explained: bool) -> tuple[int, int]:
    """Log a hole accepted as offsets holding no record; return it. One the log
    explained (a transaction marker, say) is routine: DEBUG. One that repeated seeks
    confirmed is not: a WARNING (tests/kafka/test_offset_holes.py reads both)."""
    if explained:
        log.debug("%s[%d]: offsets %d..%d hold no record (passed)", tp[0], tp[1], *hole)
    else:
        log.warning("%s[%d]: offsets %d..%d do not exist (accepted as a gap)", tp[0], tp[1], *hole)
    return hole


@dataclass(frozen=True)
class Consumer:
    """What the reader needs of the Kafka consumer."""

    #: Ask the consumer to read ``tp`` again from an offset.
    seek: Callable[[Any, int], Awaitable[Any]]
    #: Let the consumer commit past offsets (from, to inclusive) that do not exist.
    add_gap: Callable[[Any, int, int], Awaitable[None]]
    #: The partition's start offset: committed, else the log's first; None once revoked.
    start_offset: Callable[[tuple[str, int]], Awaitable[int | None]]
    #: The consumer's position in ``tp``: the offset of the next record it returns.
    position: Callable[[Any], Awaitable[int | None]]
    #: Let the consumer commit past offsets (from, to inclusive) at a partition's end
    #: that hold no record (``add_gap`` only counts below a later record).
    pass_end: Callable[[Any, int, int], None]


class LaneReader:
    """Feeds a runtime from a lane buffer (see the module's promise)."""

    def __init__(
        self,
        ledger: Ledger,
        consumer: Consumer,
        *,
        spawn: Callable[[Awaitable[Any]], Any] | None = None,
        on_passed: Callable[[int, bool], None] | None = None,
    ) -> None:
        self.ledger = ledger
        self._lane_of = ledger.lane_of_topic
        self._consumer = consumer
        self._spawn = spawn or self._track
        self._tasks: set[asyncio.Task[Any]] = set()
        self._looking_up: set[Hashable] = set()
        #: Told (offsets, explained) of each hole passed: a metric's source.
        self._on_passed = on_passed or (lambda count, explained: None)
        self._stopping = False

    @property
    def buffer(self) -> LaneBuffer:
        return self.ledger.buffer

    @property
    def continuity(self) -> Continuity:
        return self.ledger.continuity

    def _track(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("lane reader task failed", exc_info=task.exception())

    def wake(self) -> None:
        """Something changed (records arrived, a lane has room, a start is known)."""
        self.buffer.arrived.set()

    async def run(self, runtime: Runtime) -> None:
        """Take buffered records into ``runtime`` for as long as the worker runs."""
        arrived = self.buffer.arrived
        while True:
            await arrived.wait()
            arrived.clear()
            if self._pass(runtime):
                arrived.set()  # more may be left: pass again once the loop had its turn
                await asyncio.sleep(0)

    def _pass(self, runtime: Runtime) -> int:
        """Take up to CHUNK records, realtime's first; return how many."""
        if self._stopping:
            self.ledger.give_up()  # fetched after the stop began: read again after a restart
            return 0
        taken = 0
        for lane in LANES:
            if self.buffer.pending(lane):
                taken += self.buffer.drain(lane, lambda r: self._take(runtime, r), CHUNK - taken)
                if taken >= CHUNK:
                    break
        return taken

    def _take(self, runtime: Runtime, record: Any) -> int:
        tp = record.tp
        if not self.continuity.knows(tp):
            self._look_up(tp)
            return SKIP
        schema_id = runtime.schemas.wanted(record.value)
        if schema_id is not None:  # registry-framed, its writer schema not known yet
            runtime.schemas.look_up(schema_id, self.wake)
            return SKIP
        lane = self._lane_of[record.topic]
        if not runtime.has_room(lane, record_size(record)):
            return STOP
        verdict = self.continuity.check(tp, record.offset)
        if verdict.seek_to is not None:
            log.error(
                "%s[%d]: records %d..%d were skipped by the consumer; reading them again",
                record.topic,
                record.partition,
                verdict.seek_to,
                record.offset - 1,
            )
            self._spawn(self._seek(tp, verdict.seek_to))
        if verdict.accepted_hole is not None:
            low, high = _accepted(tp, verdict.accepted_hole, verdict.explained)
            self._on_passed(high - low + 1, verdict.explained)
            self._spawn(self._consumer.add_gap(tp, low, high))
        if not verdict.process:
            # Not answered here (a second copy, or buffered before a seek): Faust
            # must stop waiting for its ack, or a stopping worker waits forever.
            self.ledger.drop([record])
            return TAKEN
        incoming = Incoming(
            lane=lane,
            origin=Origin(
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
                timestamp_ms=int((record.timestamp or 0) * 1000),
                key=record.key,
                value=record.value,
            ),
            token=record,
        )
        runtime.take(incoming)  # False: its partition was given up (the ledger dropped it)
        return TAKEN

    async def check_ends(self) -> None:
        """Look for offsets passed without a record at the end of each partition with
        nothing buffered (``Continuity.at_end``): seek back for them, or pass them once
        they prove to hold none. Call about once a second."""
        if self._stopping:
            return  # records were dropped on purpose: nothing is to be read again
        partitions: list[Any] = self.continuity.partitions()  # Kafka (topic, partition)s
        for tp in partitions:
            if self.buffer.holds(tp):
                continue
            try:
                position = await asyncio.wait_for(self._consumer.position(tp), 1.0)
            except Exception:  # revoked meanwhile, the consumer stopping: look next time
                continue
            if position is None or self.buffer.holds(tp) or not self.continuity.knows(tp):
                continue  # records arrived, or it was revoked, while the position was read
            verdict = self.continuity.at_end(tp, position)
            if verdict is None:
                continue
            if verdict.seek_to is not None:
                log.info(
                    "%s[%d]: the consumer is at %d, past the last record read; "
                    "reading from %d again",
                    tp[0],
                    tp[1],
                    position,
                    verdict.seek_to,
                )
                self._spawn(self._seek(tp, verdict.seek_to))
            if verdict.accepted_hole is not None:
                low, high = _accepted(tp, verdict.accepted_hole, verdict.explained)
                self._on_passed(high - low + 1, verdict.explained)
                self._consumer.pass_end(tp, low, high)

    async def _seek(self, tp: Any, offset: int) -> None:
        with contextlib.suppress(Exception):  # revoked meanwhile: the next owner reads it
            await self._consumer.seek(tp, offset)

    def _look_up(self, tp: Any) -> None:
        if tp in self._looking_up:
            return
        self._looking_up.add(tp)
        self._spawn(self._start_of(tp))

    async def _start_of(self, tp: Any) -> None:
        try:
            start = await self._consumer.start_offset((tp[0], tp[1]))
        finally:
            self._looking_up.discard(tp)
        if start is None:  # revoked while its start was looked up: not ours
            self.ledger.drop(self.buffer.drop([tp]))
            return
        if not self.continuity.knows(tp):
            self.continuity.start_at(tp, start)
        self.wake()

    def stop(self) -> None:
        """The worker is stopping: every record fetched from now on is dropped (the
        ledger's ``give_up`` drops those buffered now), so its stop waits for no record
        it has not taken on."""
        self._stopping = True
