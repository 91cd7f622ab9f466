"""The worker's patches of Faust's consumer, and the calls the lane reader makes on it.

See the package's promise (:mod:`pipeline.kafka.faust_edge`) for what each one is for;
:func:`pipeline.kafka.faust_edge.check` names the private attributes they rely on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from aiokafka.consumer.fetcher import FetchResult
from aiokafka.errors import IllegalStateError
from aiokafka.structs import TopicPartition
from faust.transport.consumer import Consumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.types import TP

from pipeline.kafka.faust_edge.passed import PassedOffsets

__all__ = [
    "add_gap",
    "committed",
    "forget",
    "install",
    "note_passed",
    "pass_end",
    "pause_fetch",
    "position",
    "releaser",
    "resume_fetch",
    "seek",
    "seek_to_committed_or_start",
    "set_fetch_max_wait",
]

log = logging.getLogger(__name__)

# Looked up softly: a Faust without them must reach check()'s one-line refusal.
_ORIGINAL_ADD_GAP: Any = getattr(Consumer, "_add_gap", None)
_ORIGINAL_GETMANY: Any = getattr(Consumer, "getmany", None)
_ORIGINAL_ON_PARTITIONS_REVOKED: Any = getattr(Consumer, "on_partitions_revoked", None)
_ORIGINAL_CREATE_WORKER_CONSUMER: Any = getattr(
    AIOKafkaConsumerThread, "_create_worker_consumer", None
)
_ORIGINAL_GETALL: Any = getattr(FetchResult, "getall", None)
#: Commits at a revoke, at most: each takes the acks that arrived during the one before.
_REVOKE_COMMIT_ROUNDS = 10


def install(
    lane_topics: frozenset[str],
    sink: Callable[[list[Any]], None],
    *,
    fetch_max_wait_ms: int,
    isolation_level: str | None = None,
    passed: PassedOffsets | None = None,
) -> None:
    """Patch Faust's consumer for ``lane_topics`` (see :mod:`pipeline.kafka.faust_edge`).

    Batches: ``Consumer.getmany`` hands each fetch's lane records to ``sink``
    in one call (in the consumer's order, after its own checks: flow control,
    generation, active partitions), already tracked as unacked, so a revoke
    waits for them until they are released or forgotten. Only the other
    topics' records (the table's changelog) go on to Faust's conductor and
    streams. The consumer thread's seek back to the committed offsets goes
    through :func:`seek_to_committed_or_start`, on that thread.

    Fetches: see :func:`set_fetch_max_wait` (``isolation_level`` too). Offsets the
    fetcher passes without a record are noted in ``passed`` (see :func:`note_passed`).

    Revokes: ``Consumer.on_partitions_revoked`` first commits what was acked
    on the revoked partitions (see :func:`_commit_then_revoke`). Seeks back:
    ``Consumer.perform_seek`` never lowers a committed offset Faust holds (see
    :func:`_seek_forward_only`).
    """

    async def getmany_lanes_aside(
        self: Any,
        timeout: float,  # noqa: ASYNC109  # Faust's own signature
    ) -> AsyncIterator[tuple[Any, Any]]:
        lane_records: list[Any] = []
        try:
            async for tp, message in _ORIGINAL_GETMANY(self, timeout):
                if tp.topic in lane_topics:
                    lane_records.append(message)
                else:
                    yield tp, message
        finally:
            if lane_records:
                self._unacked_messages.update(lane_records)
                sink(lane_records)

    Consumer.getmany = getmany_lanes_aside  # type: ignore[method-assign]
    Consumer.on_partitions_revoked = _commit_then_revoke  # type: ignore[method-assign]
    Consumer.perform_seek = _seek_forward_only  # type: ignore[method-assign]

    async def seek_lanes_to_committed_or_start(self: Any) -> Any:
        return await self.call_thread(
            seek_to_committed_or_start, self._ensure_consumer(), lane_topics
        )

    AIOKafkaConsumerThread.seek_to_committed = (  # type: ignore[method-assign]
        seek_lanes_to_committed_or_start
    )
    set_fetch_max_wait(fetch_max_wait_ms, isolation_level=isolation_level)
    if passed is not None:
        note_passed(passed)


def note_passed(passed: PassedOffsets) -> None:
    """Note in ``passed`` the offsets aiokafka's fetcher walks past without handing a
    record over (a transaction's marker, an aborted or compacted record): its
    ``FetchResult.getall`` hands over nothing unless its data starts at the consumer's
    position, and moves the position past all it walked (see
    :mod:`pipeline.kafka.faust_edge.passed`). Runs on the consumer's thread, in the call
    that moves the position, so a note is made before its records reach the reader
    and before the position that passed it can be read."""
    getall = _ORIGINAL_GETALL

    def getall_noting_passed(self: Any, max_records: int | None = None) -> Any:
        walked = self._partition_records  # None once drained; getall may drop it too
        if walked is None:
            return getall(self, max_records)
        start = walked.next_fetch_offset  # the position, when getall hands anything over
        records = getall(self, max_records)
        passed.note(self._topic_partition, start, records, walked.next_fetch_offset)
        return records

    FetchResult.getall = getall_noting_passed


def set_fetch_max_wait(fetch_max_wait_ms: int, *, isolation_level: str | None = None) -> None:
    """Make every Faust worker consumer made from now on wait at most
    ``fetch_max_wait_ms`` in a fetch (Faust hard-codes 1500), and read with
    ``isolation_level`` when given (Faust asks for ``read_committed`` only with
    ``exactly_once`` processing; ``read_uncommitted`` otherwise).

    aiokafka sends one fetch at a time to a broker, and leaves out of it the
    partitions whose last fetched records were not yet taken. A fetch sent then
    covers only partitions with nothing new and waits at the broker for this long,
    while the left-out partitions' next records wait behind it; so does a
    partition resumed while a fetch is under way. With 1500, a bare Faust agent
    draining a burst of 10,000 stood idle about 1.4 s in half the runs (4,600 against
    13,000 events/s).
    """
    create = _ORIGINAL_CREATE_WORKER_CONSUMER

    def create_with_fetch_wait(self: Any, transport: Any) -> Any:
        consumer = create(self, transport)
        # Both are read when the consumer's start() makes its fetcher.
        consumer._fetch_max_wait_ms = fetch_max_wait_ms
        if isolation_level is not None:
            consumer._isolation_level = isolation_level
        return consumer

    AIOKafkaConsumerThread._create_worker_consumer = (  # type: ignore[method-assign]
        create_with_fetch_wait
    )


async def _seek_forward_only(self: Any) -> None:
    """Faust 0.15.3's ``Consumer.perform_seek``, except that the committed offset
    Faust holds for a partition never moves back.

    The seek looks the group's committed offsets up while a commit may land (the
    periodic one, or a revoke's). The lookup can then answer with the offset from
    before that commit, and Faust took it: its committed offset fell below acks
    its commit had already removed, so ``_new_offset`` (``min(acked) - committed
    > 1``) refused every later commit of the partition until the next rebalance.
    Seen once in 17 runs of tests/kafka/test_rebalance_give_up.py: bulk[1]
    committed 32 and then nothing for 80 s. A lower offset from the lookup can
    only be that race (a partition revoked from this consumer leaves Faust's map),
    so the higher one stands; the consumer's position is left where the lookup
    put it, and records read again are passed over or answered again as in any
    seek back.
    """
    looked_up = {
        TP(tp.topic, tp.partition): at for tp, at in (await self.seek_to_committed()).items()
    }
    self._read_offset.update(  # where reading resumes, as Faust has it
        {tp: at if at is not None and at >= 0 else None for tp, at in looked_up.items()}
    )
    held = self._committed_offset
    for tp, at in looked_up.items():
        if at is not None:
            mine = held.get(tp)
            held[tp] = mine if mine and mine > at else (at or None)


async def _commit_then_revoke(self: Any, revoked: Any) -> None:
    """Commit the revoked partitions' acked offsets, then revoke them as Faust does.

    Faust's ``Consumer.on_partitions_revoked`` pops each revoked partition's acked
    offsets (``_acked``) and only then runs the app's revoke, whose commit
    (``wait_empty``) sees only the acks that arrive after the pop: everything acked
    since the last periodic commit (``broker_commit_interval``) was answered again by
    the partitions' next owners. Here it is committed first, while the partitions are
    still this member's (aiokafka runs the revoke before JoinGroup, and the broker
    takes the current generation's commit then), up to the last ack before the pop:
    nothing awaits between the last commit here and the pop. Only released inputs
    are acked, so this commits nothing the periodic commit would not have. A failed
    commit costs repeats only: the revoke goes on.
    """
    try:
        # An ack that arrives while a commit awaits the broker waits in _acked for the
        # next one: commit again until none is left (or a commit makes no progress).
        for _ in range(_REVOKE_COMMIT_ROUNDS):
            await self.maybe_wait_for_commit_to_finish()  # else commit() only waits for it
            if not await self.commit(revoked):
                break
            if not any(self._acked.get(tp) for tp in revoked):
                break
    except Exception as exc:  # the revoke must go on
        log.warning("commit at the revoke failed (its inputs are read again): %r", exc)
    await _ORIGINAL_ON_PARTITIONS_REVOKED(self, revoked)


async def seek_to_committed_or_start(consumer: Any, lane_topics: frozenset[str]) -> Any:
    """aiokafka's ``seek_to_committed`` on ``consumer`` (an ``AIOKafkaConsumer``), then
    the lane partitions it left where they were sought to their first offset; returns
    the committed offsets as aiokafka does (None where there is none).

    aiokafka seeks only partitions with a committed offset above 0. Faust's
    ``perform_seek`` relies on it to read again the records its ``getmany`` drops
    in a rebalance (flow stopped, generation changed), so in a lane partition the
    group had committed nothing for, those records were never fetched again. The
    reader (worker/continuity.py) notices a hole only when a later record arrives,
    so with no more input the partition's last requests waited unanswered until
    the next rebalance. Such a partition is now read from its first offset, as a
    fresh assignment reads it (``auto_offset_reset`` "earliest", the start
    :mod:`pipeline.worker.start_offsets` expects); a record the reader already
    took in this assignment is passed over there, not answered twice.
    """
    committed = await consumer.seek_to_committed()
    assigned = consumer.assignment()  # one revoked meanwhile is read by its next owner
    unsought = [tp for tp, at in committed.items() if not at and tp.topic in lane_topics]
    unsought = [tp for tp in unsought if tp in assigned]
    if unsought:
        try:
            await consumer.seek_to_beginning(*unsought)
        except Exception as exc:  # a rebalance under way resets the positions anyway
            log.warning("lane partitions without a commit not rewound: %r", exc)
        else:
            log.info(
                "lane partitions without a commit read from their first offset: %s",
                ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(unsought)),
            )
    return committed


def releaser(consumer_of: Callable[[], Any]) -> Callable[[Any], Awaitable[None]]:
    """The ack of an input the watermark released (its token is the Faust message)."""

    async def release(message: Any) -> None:
        consumer_of().ack(message)

    return release


async def add_gap(consumer: Any, tp: Any, offset_from: int, offset_to: int) -> None:
    """Let Faust commit past offsets ``offset_from..offset_to`` that do not exist."""
    await _ORIGINAL_ADD_GAP(consumer, tp, offset_from, offset_to)


class _Absent:
    """An offset of a lane partition that holds no record, acked as if it did."""

    def __init__(self, tp: Any, offset: int) -> None:
        self.tp = TP(tp[0], tp[1])
        self.topic = self.tp.topic
        self.offset = offset
        self.acked = False


def pass_end(consumer: Any, tp: Any, offset_from: int, offset_to: int) -> None:
    """Let Faust commit past offsets ``offset_from..offset_to`` at the end of ``tp``
    that hold no record (a transaction's marker, say): each is acked as a record would
    be. Faust's gaps (:func:`add_gap`) count only below an acked offset, so a hole no
    record follows kept the group's lag at its size for good."""
    for offset in range(offset_from, offset_to + 1):
        consumer.ack(_Absent(tp, offset))


def pause_fetch(consumer: Any, tp: Any) -> None:
    """Stop fetching ``tp`` until :func:`resume_fetch`: aiokafka's own pause, made on
    the consumer's thread. Records of ``tp`` fetched before it is made are handed over
    (a lane exceeds its bound by at most one fetch) or, once it is made, dropped
    unread by aiokafka with ``tp``'s position left before them: fetched again after
    the resume, never lost.

    Not Faust's flow control (``on_buffer_full``), which only leaves ``tp`` out of
    the partitions its ``getmany`` asks aiokafka for, while aiokafka goes on
    fetching ``tp``. A ``getmany`` asked before a resume waited with the old set of
    partitions, up to its 1 s timeout, while the resumed partition's records lay
    fetched: a noop worker draining a burst of 10,000 stood idle once or twice for
    0.6-0.8 s and answered 4,800-8,500 events/s (median 5,800); paused in aiokafka,
    7,500-9,700/s (docs/design.md, "Pausing a full lane")."""
    _on_consumer_thread(consumer, tp, lambda c, partition: c.pause(partition), "paused")


def resume_fetch(consumer: Any, tp: Any) -> None:
    """Fetch ``tp`` again, from its position (see :func:`pause_fetch`)."""
    _on_consumer_thread(consumer, tp, lambda c, partition: c.resume(partition), "resumed")


async def seek(consumer: Any, tp: Any, offset: int) -> None:
    """Make ``tp``'s next fetch start at ``offset``: aiokafka's ``seek``, made on the
    consumer's thread (a revoked partition is let be: its next owner reads it).

    Not Faust's ``Consumer.seek``, which makes aiokafka's synchronous ``seek`` on the
    caller's thread, the event loop's: it rewrites the partition's fetch state while
    the consumer thread may be fetching, resetting or reassigning it (a rejoin after
    a stall), and resolves two futures of the consumer thread's loop from the wrong
    thread. That loop is uvloop's, whose ``call_soon`` is not thread-safe (it appends
    to the loop's ready queue and starts a libuv handle from the calling thread).
    The one fault test that failed (1 in 4 runs) went silent right after such a
    seek back, after a rejoin: no record, no commit, no "seeking again" from the
    once-a-second timer, for 90 s. Made on the consumer's thread, the seek runs
    between that thread's own steps.
    """
    _on_consumer_thread(consumer, tp, lambda c, partition: c.seek(partition, offset), "sought")


async def position(consumer: Any, tp: Any, timeout_s: float = 1.0) -> int | None:
    """The consumer's position in ``tp`` (the offset of the next record it returns),
    read on the consumer's thread; raises (TimeoutError, IllegalStateError) when it
    has none within ``timeout_s`` (a reset under way) or ``tp`` is not assigned.

    Not Faust's ``position``, which queues aiokafka's ``position`` on the consumer
    thread's method queue (two workers, shared with fetches, commits and seeks back):
    while a partition's position is being reset that call waits on the thread even
    after its caller gave up, so a few of them could hold every worker."""
    thread = consumer._thread
    aiokafka_consumer = thread._ensure_consumer()
    partition = TopicPartition(tp[0], tp[1])
    waited = asyncio.wait_for(aiokafka_consumer.position(partition), timeout_s)
    done = asyncio.run_coroutine_threadsafe(waited, thread.thread_loop)
    return await asyncio.wrap_future(done)


def _on_consumer_thread(
    consumer: Any, tp: Any, act: Callable[[Any, Any], object], what: str
) -> None:
    thread = consumer._thread  # aiokafka's state belongs to the consumer thread's loop
    aiokafka_consumer = thread._ensure_consumer()
    partition = TopicPartition(tp[0], tp[1])

    def apply() -> None:
        # Revoked meanwhile: its next assignment starts afresh.
        with contextlib.suppress(IllegalStateError):
            act(aiokafka_consumer, partition)

    try:
        thread.thread_loop.call_soon_threadsafe(apply)
    except RuntimeError:  # the consumer thread's loop is closed: the worker is stopping
        log.debug("%s not %s: the consumer has stopped", partition, what)


def forget(consumer: Any, messages: Iterable[Any]) -> None:
    """Stop Faust waiting for the ack of ``messages`` (not answered here: a second copy,
    or a record buffered before a seek); their offsets stay uncommitted."""
    for message in messages:
        consumer.unacked.discard(message)


def committed(consumer: Any, tp: Any) -> int | None:
    """The consumer's last committed offset of ``tp``, or None when it has none."""
    value = consumer._committed_offset.get(tp)
    return None if value is None else int(value)
