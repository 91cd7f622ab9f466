"""Every use of faust-streaming's private parts, in one place, checked at start-up.

The worker needs a few things Faust's public API does not offer; each is
made here, and nowhere else:

- lane offsets skipped by the consumer are not "gaps" that count as acked,
  and lane records sought back for are not dropped (:func:`install`, see
  ``continuity.py`` for why);
- a lane offset is acked to Faust only once the pipeline's own watermark
  released it (:func:`release`): Faust also acks events its streams skip
  while flow control is suspended, even on ``noack()`` streams, and after a
  revoke it forgets the committed offset that keeps its commit from jumping
  ahead; either would let a commit pass an input nobody answered;
- a record the agent passes over is dropped from Faust's unacked set, so a
  stopping worker does not wait for it (:func:`forget`);
- table writes run in a record's event context, so the changelog record goes
  to the record's partition (:func:`in_event_context`);
- the consumer's committed offsets, for the lag metric (:func:`committed`);
- the dedupe table is written into its local store directly and its changelog
  records go out through the worker's librdkafka producer
  (:class:`ChangelogStore`): through Faust's table API each write is one
  record on Faust's aiokafka producer, whose buffer of 100 records stalled
  intake ("producer buffer full") and cut a noop worker's throughput by more
  than half.

:func:`check` runs when ``pipeline.app`` is imported: a Faust other than the
pinned, tested one (``constraints.txt``), or one without these attributes,
stops the worker with one line before it joins the consumer group.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import logging
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from types import ModuleType
from typing import Any

import faust.streams
from faust.transport.consumer import Consumer

from pipeline.errors import ConfigurationError

__all__ = [
    "TESTED_FAUST",
    "ChangelogStore",
    "add_gap",
    "check",
    "committed",
    "forget",
    "in_event_context",
    "install",
    "release",
]

log = logging.getLogger(__name__)

#: The faust-streaming release these patches were written and tested against.
TESTED_FAUST = "0.15.3"

#: Instance attributes of ``faust.transport.consumer.Consumer`` used here.
_CONSUMER_STATE = ("_read_offset", "_committed_offset", "_unacked_messages")
#: Methods of ``Consumer`` replaced or called here.
_CONSUMER_METHODS = ("_add_gap", "ack", "seek", "unacked")

# Looked up softly: a Faust without them must reach check()'s one-line refusal.
_ORIGINAL_ADD_GAP: Any = getattr(Consumer, "_add_gap", None)
_ORIGINAL_ACK: Any = getattr(Consumer, "ack", None)

#: Lane messages the watermark released; only these may be acked to Faust.
_RELEASED: weakref.WeakSet[Any] = weakref.WeakSet()


def check(
    version: str | None = None,
    consumer: type = Consumer,
    streams: ModuleType = faust.streams,
    store: type | None = None,
) -> None:
    """Raise ConfigurationError (one line) unless Faust is the tested release and has
    every private attribute this module relies on."""
    if store is None:
        from faust.stores.rocksdb import Store as store
    found = version if version is not None else importlib.metadata.version("faust-streaming")
    if found != TESTED_FAUST:
        raise ConfigurationError(
            f"faust-streaming {found} is installed, but the worker patches private parts of "
            f"{TESTED_FAUST} (pipeline/faust_edge.py): install the pinned versions with "
            "`pip install -c constraints.txt -e .` (./run setup does)"
        )
    missing = [f"Consumer.{name}" for name in _CONSUMER_METHODS if not hasattr(consumer, name)]
    try:
        init = inspect.getsource(vars(consumer)["__init__"])
    except (KeyError, OSError, TypeError):
        init = ""
    missing += [f"Consumer.{name}" for name in _CONSUMER_STATE if f"self.{name}" not in init]
    if not hasattr(streams, "_current_event"):
        missing.append("faust.streams._current_event")
    if not hasattr(store, "set_persisted_offset"):
        missing.append("faust.stores.rocksdb.Store.set_persisted_offset")
    if missing:
        raise ConfigurationError(
            f"faust-streaming {found} lacks {', '.join(missing)}, which the worker relies on "
            "(pipeline/faust_edge.py): reinstall with `pip install -c constraints.txt -e .`"
        )


def install(lane_topics: frozenset[str]) -> None:
    """Patch Faust's consumer for ``lane_topics`` (see the module's promise).

    Gaps: Faust fills a jump in offsets with a "gap" that counts as acked and
    is committed past; on the lane topics a jump means records were skipped
    (see continuity.py), so the jump must hold the commit back instead. Real
    holes are added explicitly by the agent once confirmed (:func:`add_gap`).

    Read offsets: Faust drops a fetched record below the partition's "read
    offset". A seek lowers that offset, but the fetch loop raises it again
    when it resumes after handing over the record that prompted the seek, so
    the records sought back for were dropped once more: the partition stalled,
    or the hole passed for real and was committed past (the fault tests saw
    both). On the lane topics no record is dropped this way; the agent judges
    offsets itself.

    Acks: on the lane topics Faust's ``ack`` accepts only messages passed to
    :func:`release`; every other ack (a skipped event's, say) is refused and
    leaves the message unacked, so it is committed only once answered.
    """

    async def add_gap_outside_lanes(self: Any, tp: Any, offset_from: int, offset_to: int) -> None:
        if tp.topic in lane_topics:
            return
        await _ORIGINAL_ADD_GAP(self, tp, offset_from, offset_to)

    class ReadOffsets(defaultdict[Any, int | None]):
        def __getitem__(self, tp: Any) -> int | None:
            return None if tp.topic in lane_topics else super().__getitem__(tp)

    def set_read_offsets(self: Any, offsets: Any) -> None:
        self.__dict__["_read_offset"] = ReadOffsets(lambda: None, offsets)

    def ack_released_only(self: Any, message: Any) -> bool:
        if message.topic in lane_topics and message not in _RELEASED:
            return False
        return bool(_ORIGINAL_ACK(self, message))

    Consumer._add_gap = add_gap_outside_lanes  # type: ignore[method-assign]
    Consumer._read_offset = property(  # type: ignore[assignment]
        lambda self: self.__dict__["_read_offset"], set_read_offsets
    )
    Consumer.ack = ack_released_only  # type: ignore[method-assign]


async def release(token: Any) -> None:
    """Ack an input the watermark released: ``token`` is the agent's (stream, event)."""
    stream, event = token
    _RELEASED.add(event.message)
    await stream.ack(event)


async def add_gap(consumer: Any, tp: Any, offset_from: int, offset_to: int) -> None:
    """Let Faust commit past offsets ``offset_from..offset_to`` that do not exist."""
    await _ORIGINAL_ADD_GAP(consumer, tp, offset_from, offset_to)


def forget(consumer: Any, messages: Iterable[Any]) -> None:
    """Stop Faust waiting for the ack of ``messages`` (not answered here: a second copy,
    or a record buffered before a seek); their offsets stay uncommitted."""
    for message in messages:
        consumer.unacked.discard(message)


def in_event_context(token: Any, fn: Callable[[], None]) -> None:
    """Run a table write as if inside the event's stream, so the changelog
    record goes to the event's partition (Faust reads it from a context var)."""
    _stream, event = token
    reset = faust.streams._current_event.set(weakref.ref(event))
    try:
        fn()
    finally:
        faust.streams._current_event.reset(reset)


def committed(consumer: Any, tp: Any) -> int | None:
    """The consumer's last committed offset of ``tp``, or None when it has none."""
    value = consumer._committed_offset.get(tp)
    return None if value is None else int(value)


#: Sends one changelog record without waiting: (topic, key, value, partition) -> the
#: future of its offset; raises BufferError while the producer's queue is full.
ChangelogSend = Callable[[str, bytes, bytes, int], "asyncio.Future[int]"]


class ChangelogStore(MutableMapping[bytes, bytes]):
    """A Faust table's local RocksDB store, with its changelog written by ``send``.

    Reads and writes go to ``table.data`` (the store Faust restores from the
    changelog on assignment); a write, made in a record's event context (see
    :func:`in_event_context`), also sends ``(key, value)`` to the table's
    changelog topic, on the record's partition, exactly as Faust would (raw
    key and value bytes), so Faust's recovery reads it back. The send is not
    awaited: a changelog record lost in a crash only costs a recomputation on
    the partition's next owner. Delivered offsets are remembered per partition
    and written as the store's persisted offsets by :meth:`flush_offsets`, so a
    restart replays only the changelog's tail.
    """

    def __init__(self, table: Any, send: ChangelogSend) -> None:
        self._data: Any = table.data
        self._topic: str = table.changelog_topic.get_topic_name()
        self._send = send
        self._delivered: dict[int, int] = {}
        self.failures = 0

    def __getitem__(self, key: bytes) -> bytes:
        return self._data[key]  # type: ignore[no-any-return]

    def get(self, key: bytes, default: Any = None) -> Any:
        return self._data.get(key, default)

    def __setitem__(self, key: bytes, value: bytes) -> None:
        event = faust.streams.current_event()
        if event is None:
            raise RuntimeError("a dedupe entry is written in its record's event context")
        partition = int(event.message.partition)
        self._data[key] = value
        try:
            fut = self._send(self._topic, key, value, partition)
        except BufferError:
            self._failed(partition, "the producer's queue is full")
            return
        fut.add_done_callback(lambda f: self._done(partition, f))

    def _done(self, partition: int, fut: asyncio.Future[int]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            self._failed(partition, repr(None if fut.cancelled() else fut.exception()))
            return
        offset = fut.result()
        if offset > self._delivered.get(partition, -1):
            self._delivered[partition] = offset

    def _failed(self, partition: int, why: str) -> None:
        self.failures += 1
        if self.failures == 1 or not self.failures % 1000:
            log.warning(
                "dedupe changelog %s[%d]: a record was not written (%s; %d so far): "
                "the entry is only local, another worker will compute it again",
                self._topic,
                partition,
                why,
                self.failures,
            )

    def flush_offsets(self) -> None:
        """Record the changelog offsets delivered so far as the store's persisted ones."""
        from faust.types import TP

        delivered, self._delivered = self._delivered, {}
        for partition, offset in delivered.items():
            self._data.set_persisted_offset(TP(self._topic, partition), offset)

    def __delitem__(self, key: bytes) -> None:
        raise NotImplementedError("dedupe entries leave by TTL, never by delete")

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)
