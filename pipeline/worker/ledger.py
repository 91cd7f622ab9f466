"""The ledger: the one keeper of a lane record's offset and bounds, from the fetch to the release.

A lane record is in one of three places here, each a part of the ledger:

- **fetched** (:class:`~pipeline.worker.lane_buffer.LaneBuffer`): waiting for
  intake, per partition in offset order, bounded per lane (a full lane's
  partitions leave the fetcher);
- **checked** (:class:`~pipeline.worker.continuity.Continuity`, against each
  partition's start from :class:`~pipeline.worker.start_offsets.StartOffsets`):
  its offset is the one expected next, or a hole is sought back for;
- **held** (:class:`~pipeline.worker.admission.Admission`): taken on by the
  runtime, counted against its lane's bounds (records, bytes) and its offset
  held in its partition's watermark until :meth:`Ledger.release` hands the
  contiguous prefix of answered offsets back to be acknowledged.

Nobody else keeps per-offset state of a lane record (Faust keeps its unacked
set, which the ledger's ``forget`` callable trims). The verbs change it:
:meth:`fetched`, :meth:`assigned`, :meth:`hold`, :meth:`release`,
:meth:`give_up` (a rebalance or a stop starts: unstarted inputs and every
buffered record are dropped, read again by the partition's next owner),
:meth:`revoked` (the partitions are gone: everything known of them goes).
The lane reader moves records from the buffer into the runtime and reads the
parts; the runtime owns the ledger and is told when a lane frees room
(``on_room``, bound by the runtime to its events).

Pure: no Faust, no Kafka; the consumer is reached through injected callables.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pipeline.settings import LANES, Settings
from pipeline.worker.admission import Admission, LaneBounds
from pipeline.worker.continuity import Continuity, Explains
from pipeline.worker.lane_buffer import LaneBuffer
from pipeline.worker.records import Incoming, Origin, record_size
from pipeline.worker.start_offsets import StartOffsets

__all__ = ["Ledger"]

log = logging.getLogger(__name__)


def _nothing(*_args: Any) -> None:
    return None


class Ledger:
    """Fetched, checked and held lane records of one worker (see the module's promise).

    ``pause``/``resume`` take a partition out of the fetcher and back;
    ``forget`` tells the consumer to stop waiting for records dropped here;
    ``explains`` says whether the fetcher walked past offsets without a record
    (a transaction marker); ``forget_passed`` drops those notes of a revoked
    partition; ``starts`` looks partitions' start offsets up.
    """

    def __init__(
        self,
        settings: Settings,
        lane_of_topic: Mapping[str, str],
        *,
        clock_ms: Callable[[], int],
        pause: Callable[[Any], None] = _nothing,
        resume: Callable[[Any], None] = _nothing,
        forget: Callable[[list[Any]], None] = _nothing,
        explains: Explains | None = None,
        forget_passed: Callable[[Any], None] = _nothing,
        starts: StartOffsets | None = None,
    ) -> None:
        batch = settings.batch
        self.lane_of_topic = dict(lane_of_topic)
        self.buffer = LaneBuffer(
            self.lane_of_topic,
            LaneBounds(batch.stream_buffer, batch.max_inflight_bytes),
            pause=pause,
            resume=resume,
        )
        self.continuity = Continuity(explains=explains) if explains else Continuity()
        self.starts = starts or StartOffsets(settings)
        #: Told whenever a lane frees room (the runtime binds it to its events).
        self.on_room: Callable[[], None] = _nothing
        self.admission: Admission[Any] = Admission(
            LANES,
            LaneBounds(batch.max_inflight, batch.max_inflight_bytes),
            clock_ms=clock_ms,
            on_room=self._room_freed,
        )
        self._forget = forget
        self._forget_passed = forget_passed

    def _room_freed(self) -> None:
        self.on_room()

    # -- the fetch ----------------------------------------------------------------

    def fetched(self, records: Iterable[Any]) -> None:
        """One fetch's lane records (in the consumer's order): buffered."""
        self.buffer.put(records)

    def assigned(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Partitions are (again) this worker's: look their start offsets up."""
        self.starts.assigned(partitions)

    def drop(self, records: list[Any]) -> None:
        """Records passed over (a second copy, a partition given up): the consumer
        stops waiting for them; their offsets stay uncommitted."""
        if records:
            self._forget(records)

    # -- held inputs --------------------------------------------------------------

    def has_room(self, lane: str, size: int) -> bool:
        """Whether ``lane`` may hold one more input of ``size`` bytes."""
        return self.admission.has_room(lane, size)

    def hold(self, incoming: Incoming) -> bool:
        """Hold the input's offset and count it against its lane (the caller asked
        :meth:`has_room`). False when its partition was given up and not yet revoked:
        the input is not this worker's to answer, and the consumer is told so."""
        origin = incoming.origin
        tp = (origin.topic, origin.partition)
        size = record_size(origin)
        if self.admission.hold(incoming.lane, tp, origin.offset, size, incoming.token):
            return True
        self.drop([incoming.token])
        return False

    def release(self, origin: Origin) -> list[Any]:
        """The input is answered: free its room; return the tokens now safe to ack."""
        return self.admission.release((origin.topic, origin.partition), origin.offset)

    def pending(self) -> int:
        """Inputs held and not yet released, over every lane."""
        return self.admission.pending()

    def oldest_ms(self) -> int:
        """How long the oldest input held and not yet released has waited (0: none)."""
        return self.admission.oldest_ms()

    # -- rebalances and stops -------------------------------------------------------

    def give_up(self, unstarted: Iterable[Incoming] = ()) -> tuple[int, int]:
        """A rebalance (or a stop) starts: abandon the ``unstarted`` inputs and every
        buffered record; the consumer stops waiting for them and for the held inputs
        behind an abandoned one. Returns (inputs stranded behind, records dropped)."""
        stranded = self.admission.give_up(
            ((i.origin.topic, i.origin.partition), i.origin.offset) for i in unstarted
        )
        dropped = self.buffer.clear()
        self.drop(stranded + dropped)
        return len(stranded), len(dropped)

    def revoked(self, tps: Iterable[Any]) -> int:
        """Partitions were revoked: drop everything known of them (their records are
        redelivered to the next owner); return how many held inputs were dropped."""
        tps = list(tps)
        self.drop(self.buffer.drop(tps))
        held = 0
        for tp in tps:
            self.continuity.forget(tp)
            self._forget_passed(tp)
            self.starts.forget((tp[0], tp[1]))
            held += self.admission.forget((tp[0], tp[1]))
        return held
