"""Repeats: the worker's one owner of dedupe state.

A repeat is an input whose result is already known, or already being
computed, under its dedupe key (:class:`~pipeline.codecs.keys.InputKeys`). This
module holds everything the worker knows about that, and nothing else does:

- the stored results (:class:`~pipeline.worker.dedupe.StoredResults`, the RocksDB
  table), read by :meth:`Repeats.recall` and written by
  :meth:`Repeats.remember`;
- the computations under way (:class:`~pipeline.worker.dedupe.SingleFlight`):
  :meth:`Repeats.lead` picks one leader per key from a batch, and a later
  twin joins the running computation;
- the results computed and published but not yet stored (``settled``): a
  repeat that arrives between the leader's answer and its store write is
  answered from memory, so there is no window in which it is computed again.

It is asked twice before the model and told once after it:

1. :meth:`recall` when a record is taken on (``Runtime.take``);
2. :meth:`lead` when its batch is formed: work queued while a twin was being
   computed finds that twin's result now (settled or stored), or joins its
   computation. Joining at intake instead would tie a realtime repeat to a
   bulk leader still queued behind other bulk work. The store is read once
   per record, at its first look; a twin stored by this worker since is found
   among the last :data:`RECENT` writes, kept in memory with their values
   (at most RECENT encoded results: ~14 MiB of 384-float embeddings). Work
   that waited through more writes than that is computed again (a repeated
   computation, never a wrong answer);
3. :meth:`finish` when the model answered a key, then :meth:`remember` (the
   store write) once the leader's result is acknowledged by the broker, or
   :meth:`forget` when it will not be stored.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.inference import Prediction
from pipeline.worker.dedupe import SingleFlight, StoredResults
from pipeline.worker.records import Work

__all__ = ["RECENT", "Known", "Repeats", "StoreFn"]

#: Store writes remembered by key, to tell whether a key was stored since a work's
#: first look (older work is looked up in the store again).
RECENT = 8192

#: Runs a dedupe write for the input with this token (into its partition's store).
StoreFn = Callable[[Any, Callable[[], None]], None]


def _in_any_partition(token: Any, fn: Callable[[], None]) -> None:
    fn()


@dataclass(frozen=True)
class Known:
    """A repeat's result: ``stored`` (an encoded result from the store, possibly of
    another model version: the answer path checks) or ``prediction`` computed here by
    ``leader`` and not yet stored."""

    stored: bytes | None = None
    prediction: Prediction | None = None
    leader: Work | None = None


class Repeats:
    """Owns the stored results, the computations under way and the settled results
    (see the module's promise). ``stored`` is None when dedupe against the store is
    off; ``in_partition`` runs a store write in the input's partition's store."""

    def __init__(
        self, stored: StoredResults | None, *, in_partition: StoreFn | None = None
    ) -> None:
        self.stored = stored
        self._in_partition: StoreFn = in_partition or _in_any_partition
        self._flight: SingleFlight[Work] = SingleFlight()
        # Computed results not yet durably stored: dedupe key -> (prediction, leader).
        self._settled: dict[str, tuple[Prediction, Work]] = {}
        self._writes = 0  # store writes made here so far, numbered from 1
        # key -> (its last write's number, the value written): the last RECENT writes.
        self._recent: OrderedDict[str, tuple[int, bytes]] = OrderedDict()

    def recall(self, work: Work) -> Known | None:
        """What is known of ``work``'s key: a settled result, else a stored one (read from
        the store at the first look only; afterwards, one this worker stored since, from
        memory; never again once the store's was found unusable for it), else None."""
        key = work.request.dedupe_key
        settled = self._settled.get(key)
        if settled is not None:
            return Known(prediction=settled[0], leader=settled[1])
        if self.stored is None or work.stored_unusable:
            return None
        if work.recalled_at >= 0:  # looked up before: only a write since can have it
            recent = self._recent.get(key)
            if recent is not None and recent[0] > work.recalled_at:
                return Known(stored=recent[1])
            return None
        work.recalled_at = self._writes
        stored = self.stored.get(key)
        return None if stored is None else Known(stored=stored)

    def lead(self, batch: list[Work], on_known: Callable[[Work, Known], None]) -> list[Work]:
        """The batch's leaders: one per key not computed or computing yet. Work whose
        result is known goes to ``on_known``; the rest joins its key's computation
        (``served`` says whether a twin in this batch or an earlier one leads it)."""
        leaders: list[Work] = []
        in_this_batch: set[str] = set()
        for work in batch:
            known = self.recall(work)
            if known is not None:
                on_known(work, known)
                continue
            key = work.request.dedupe_key
            if self._flight.join(key, work):
                leaders.append(work)
                in_this_batch.add(key)
            else:
                work.served = "batch" if key in in_this_batch else "inflight"
        return leaders

    def finish(self, leader: Work, prediction: Prediction | None) -> list[Work]:
        """The leader's computation ended: every requester of its key, leader first.
        With a ``prediction`` it is settled (served from memory) until :meth:`remember`
        or :meth:`forget`."""
        key = leader.request.dedupe_key
        waiters = self._flight.finish(key)
        if prediction is not None:
            self._settled[key] = (prediction, leader)
        return waiters

    def remember(self, leader: Work, value: bytes) -> None:
        """Store the leader's encoded result (call once the broker acknowledged it),
        unless it may not be reused (clipped text, a fallback model's answer); the
        settled result is dropped either way. Raises what the store raises."""
        try:
            if self.stored is not None and leader.storable and leader.model is None:
                stored, key = self.stored, leader.request.dedupe_key
                self._in_partition(leader.incoming.token, lambda: stored.put(key, value))
                self._writes += 1
                self._recent[key] = (self._writes, value)
                self._recent.move_to_end(key)
                if len(self._recent) > RECENT:
                    self._recent.popitem(last=False)
        finally:
            self.forget(leader)

    def forget(self, leader: Work) -> None:
        """The leader's result will not be stored: stop serving it from memory."""
        key = leader.request.dedupe_key
        settled = self._settled.get(key)
        if settled is not None and settled[1] is leader:
            del self._settled[key]
