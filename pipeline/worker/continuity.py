"""Notice when the consumer skipped records of a lane partition, so none is lost.

faust-streaming 0.15.3 can skip records: its ``getmany`` drops the rest of a
fetch when flow control stops or the consumer generation changes (both happen
around rebalances), and positions are reset when partitions are reassigned.
Before the worker took lane records below Faust's streams, Faust also treated
skipped offsets as a "gap" (as if they did not exist) and committed past them;
the fault tests saw hundreds of requests committed without any answer after
worker restarts under load.

So the lane reader checks every lane record against the next offset it
expected for its partition. A jump the broker's log explains is passed at once:
offsets the consumer's fetcher walked past without a record (a transaction's
control marker, an aborted transaction's records under ``read_committed``, a
record compaction removed) hold nothing to answer (``explains``, injected:
:class:`pipeline.kafka.faust_edge.PassedOffsets` in the worker); such a hole is
``Verdict.explained``, and the reader says nothing about it above DEBUG. Any
other record past the expected offset means records were
skipped: the reader seeks back and reads them again. Records buffered before
the seek (all past the hole) are passed over, and so is a record delivered
again below the expected offset: it was processed already, and processing it
again would only answer it twice. The first record fetched after the seek
tells what happened: the one sought for (the hole is filled), or a later one,
still inside the hole (those offsets did not come back). A hole the log did not
explain is accepted as real only when the same first record comes back
after :data:`SEEKS_BEFORE_ACCEPTING` seeks in a row; a record that repeats,
or a stream that restarts past the hole, means a seek was lost, and it is
redone; so is a seek whose records have not come back within
``reseek_after_ms`` (the stream kept delivering records past the hole, or
nothing at all: :meth:`Continuity.overdue` names those for a timer).

A hole at a partition's end has no record past it. There the consumer's
position tells (:meth:`Continuity.at_end`, asked by a timer for partitions
with nothing buffered): a position past the next expected offset means
offsets were passed without a record reaching the reader, dropped records or
offsets that hold none (a transaction's marker, written after its last
record). Offsets the log explains are passed at once, as above; others are
sought back for in the same way; when the position comes back
to the same offset with no record :data:`SEEKS_BEFORE_ACCEPTING` times, the
offsets are accepted as holding none, so the group can commit past them (its
lag would read 1 forever otherwise). Faust's own seek back to the committed
offsets after a rebalance reads dropped records again too, and
:func:`pipeline.kafka.faust_edge.seek_to_committed_or_start` extends it to
partitions the group has committed nothing for.

Pure: no Faust imports; the caller performs the seek.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

__all__ = ["SEEKS_BEFORE_ACCEPTING", "Continuity", "Explains", "Verdict"]

#: Seeks whose first record is the same one past the hole before it is accepted.
SEEKS_BEFORE_ACCEPTING = 2

#: Whether offsets (from, to inclusive) of a partition are known to hold no record.
Explains = Callable[[Hashable, int, int], bool]


def _unexplained(partition: Hashable, low: int, high: int) -> bool:
    return False


@dataclass(frozen=True)
class Verdict:
    """What to do with a record: process it, or seek back to ``seek_to`` first.

    ``accepted_hole`` is the range (from, to inclusive) of offsets accepted as
    non-existent, when there is one; ``explained`` when the log explained it (no
    seek was needed: a transaction marker, say), not repeated seeks.
    """

    process: bool
    seek_to: int | None = None
    accepted_hole: tuple[int, int] | None = None
    explained: bool = False


#: The common verdicts, shared (a verdict is immutable): one fewer object per record.
_PROCESS = Verdict(process=True)
_PASS = Verdict(process=False)


@dataclass
class _Pending:
    """A seek back to ``sought`` is under way."""

    sought: int
    first: int  # the earliest record past the hole seen since the last seek
    seeks: int  # seeks in a row whose first record was ``first``
    last: int  # the last offset seen since the last seek (restarts show as repeats)
    sought_at_ms: float  # when the last seek was asked for
    at_end: bool = False  # found by the position (at_end), not by a record past the hole


class Continuity:
    """Next expected offset per partition (see the module's promise)."""

    def __init__(
        self,
        *,
        reseek_after_ms: float = 2000.0,
        clock_ms: Callable[[], float] = lambda: time.monotonic() * 1000,
        explains: Explains = _unexplained,
    ) -> None:
        self._expected: dict[Hashable, int] = {}
        self._pending: dict[Hashable, _Pending] = {}
        self._explains = explains
        self._reseek_after_ms = reseek_after_ms
        self._clock_ms = clock_ms

    def check(self, partition: Hashable, offset: int) -> Verdict:
        """Judge the next record of ``partition``; call for every record, in order."""
        expected = self._expected.get(partition)
        if expected is not None and offset < expected:
            # Delivered again: processed (or accepted as a hole) already since the
            # partition was assigned, so its answer and release are under way.
            return _PASS
        pending = self._pending.get(partition)
        low = pending.sought if pending is not None else expected
        if low is not None and offset > low and self._explains(partition, low, offset - 1):
            # Every offset before this record holds none: nothing was skipped.
            self._pending.pop(partition, None)
            self._expected[partition] = offset + 1
            return Verdict(process=True, accepted_hole=(low, offset - 1), explained=True)
        if pending is not None:
            if offset == pending.sought:  # the record sought for
                del self._pending[partition]
            elif offset <= pending.first:  # fetched after the seek, yet past the hole
                seeks = pending.seeks + 1 if offset == pending.first else 1
                if seeks >= SEEKS_BEFORE_ACCEPTING:
                    del self._pending[partition]
                    self._expected[partition] = offset + 1
                    return Verdict(process=True, accepted_hole=(pending.sought, offset - 1))
                self._pending[partition] = _Pending(
                    pending.sought, offset, seeks, offset, self._clock_ms()
                )
                return Verdict(process=False, seek_to=pending.sought)
            elif offset <= pending.last:  # the stream restarted past the hole: seek lost
                pending.last = offset
                pending.sought_at_ms = self._clock_ms()
                return Verdict(process=False, seek_to=pending.sought)
            else:  # buffered before the seek; fetched again after it
                pending.last = offset
                now = self._clock_ms()
                if now - pending.sought_at_ms >= self._reseek_after_ms:  # seek lost
                    pending.sought_at_ms = now
                    return Verdict(process=False, seek_to=pending.sought)
                return _PASS
        elif expected is not None and offset > expected:
            self._pending[partition] = _Pending(expected, offset, 0, offset, self._clock_ms())
            return Verdict(process=False, seek_to=expected)
        self._expected[partition] = offset + 1
        return _PROCESS

    def overdue(self) -> list[tuple[Hashable, int]]:
        """Seeks asked for ``reseek_after_ms`` ago or longer whose records have not come
        back: (partition, offset) to seek again; each is timed afresh from now."""
        now = self._clock_ms()
        due = []
        for partition, pending in self._pending.items():
            if pending.at_end:
                continue  # at_end times its own seeks: it counts them
            if now - pending.sought_at_ms >= self._reseek_after_ms:
                pending.sought_at_ms = now
                due.append((partition, pending.sought))
        return due

    def at_end(self, partition: Hashable, position: int) -> Verdict | None:
        """Judge the consumer's ``position`` in ``partition`` while no record of it waits
        to be checked: None when nothing is to be done; else seek back to ``seek_to``
        (offsets were passed without a record), or ``accepted_hole``: the same position
        came back after :data:`SEEKS_BEFORE_ACCEPTING` seeks with no record, so those
        offsets hold none and are passed. Seeks are ``reseek_after_ms`` apart."""
        expected = self._expected.get(partition)
        if expected is None or position <= expected:
            return None
        if self._explains(partition, expected, position - 1):
            self._pending.pop(partition, None)
            self._expected[partition] = position
            return Verdict(process=False, accepted_hole=(expected, position - 1), explained=True)
        now = self._clock_ms()
        pending = self._pending.get(partition)
        if pending is None:
            self._pending[partition] = _Pending(expected, position, 0, position, now, True)
            return Verdict(process=False, seek_to=expected)
        if not pending.at_end or now - pending.sought_at_ms < self._reseek_after_ms:
            return None  # a seek for a record past the hole is check()'s and overdue()'s
        seeks = pending.seeks + 1 if position == pending.first else 1
        if seeks >= SEEKS_BEFORE_ACCEPTING:
            del self._pending[partition]
            self._expected[partition] = position
            return Verdict(process=False, accepted_hole=(pending.sought, position - 1))
        self._pending[partition] = _Pending(pending.sought, position, seeks, position, now, True)
        return Verdict(process=False, seek_to=pending.sought)

    def partitions(self) -> list[Hashable]:
        """The partitions a next offset is expected for."""
        return list(self._expected)

    def knows(self, partition: Hashable) -> bool:
        """Whether a next offset is expected for ``partition`` (False after assignment)."""
        return partition in self._expected

    def start_at(self, partition: Hashable, offset: int) -> None:
        """Expect ``partition``'s first record at ``offset`` (its committed offset), so a
        hole before the first record delivered is noticed too."""
        self._expected[partition] = offset

    def forget(self, partition: Hashable) -> None:
        """The partition was revoked: its next record may start anywhere."""
        self._expected.pop(partition, None)
        self._pending.pop(partition, None)
