"""Notice when the consumer skipped records of a lane partition, so none is lost.

faust-streaming 0.15.3 can skip records: records fetched for a partition it
paused during a rebalance are dropped, and a message whose delivery to a full
stream buffer is cancelled by a rebalance still advances the read offset. The
consumer then treats the skipped offsets as a "gap" (as if they did not exist)
and commits past them; the fault tests saw hundreds of requests committed
without any answer after worker restarts under load.

So the worker (1) tells Faust's consumer not to fill gaps on lane topics
(``app.py``), and (2) checks every lane record against the next offset it
expected for its partition. A record past that offset means records were
skipped: the worker seeks back and reads them again. If the same hole shows
up again right after that seek, the offsets really do not exist (transaction
markers, say) and the hole is accepted.

Pure: no Faust imports; the caller performs the seek.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

__all__ = ["Continuity", "Verdict"]


@dataclass(frozen=True)
class Verdict:
    """What to do with a record: process it, or seek back to ``seek_to`` first.

    ``accepted_hole`` is the range (from, to inclusive) of offsets accepted as
    non-existent, when there is one.
    """

    process: bool
    seek_to: int | None = None
    accepted_hole: tuple[int, int] | None = None


class Continuity:
    """Next expected offset per partition (see the module's promise).

    After a seek back, records past the hole that were already buffered are
    skipped (they are fetched again); the hole is accepted as real only when
    the record that revealed it comes back first after the seek.
    """

    def __init__(self) -> None:
        self._expected: dict[Hashable, int] = {}
        # partition -> (offset sought back to, offset of the record that showed the hole)
        self._pending: dict[Hashable, tuple[int, int]] = {}

    def check(self, partition: Hashable, offset: int) -> Verdict:
        """Judge the next record of ``partition``; call for every record, in order."""
        expected = self._expected.get(partition)
        pending = self._pending.get(partition)
        if pending is not None:
            sought, revealed = pending
            if offset <= sought:  # the records we sought back for, or an older rewind
                del self._pending[partition]
            elif offset == revealed:  # nothing before it came back: the hole is real
                del self._pending[partition]
                self._expected[partition] = offset + 1
                return Verdict(process=True, accepted_hole=(sought, offset - 1))
            else:
                return Verdict(process=False)  # buffered before the seek; fetched again
        elif expected is not None and offset > expected:
            self._pending[partition] = (expected, offset)
            return Verdict(process=False, seek_to=expected)
        self._expected[partition] = offset + 1
        return Verdict(process=True)

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
