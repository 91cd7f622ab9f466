"""The worker's dedupe owner (:class:`Repeats`): what it recalls, who leads a key, what
it stores, and when it stops serving a result from memory.

The store is a plain dict under the real :class:`StoredResults`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pipeline.inference import Prediction
from pipeline.worker.dedupe import Retention, StoredResults
from pipeline.worker.records import Incoming, Origin, Request, Work
from pipeline.worker.repeats import Known, Repeats

NOW = 1_000_000


def _work(key: str, offset: int = 0) -> Work:
    origin = Origin("lane.standard", 0, offset, 0, None, b"")
    request = Request(
        request_id=f"r-{offset}",
        text=key,
        created_at_ms=NOW,
        deadline_ms=NOW + 1000,
        lane="standard",
        content_hash=key,
        dedupe_key=key,
    )
    incoming = Incoming("standard", origin, token=offset)
    return Work(incoming=incoming, request=request, arrived_ms=NOW)


def _repeats(table: dict[bytes, bytes], **kwargs: Any) -> Repeats:
    return Repeats(
        StoredResults(table, retention=Retention(60_000), clock_ms=lambda: NOW), **kwargs
    )


def _lead(repeats: Repeats, batch: list[Work]) -> tuple[list[Work], list[tuple[Work, Known]]]:
    known: list[tuple[Work, Known]] = []
    leaders = repeats.lead(batch, lambda work, k: known.append((work, k)))
    return leaders, known


def test_one_leader_per_key_and_twins_say_where_they_joined() -> None:
    repeats = _repeats({})
    a, b, a2 = _work("a", 0), _work("b", 1), _work("a", 2)
    leaders, known = _lead(repeats, [a, b, a2])
    assert leaders == [a, b] and known == []
    assert a2.served == "batch"
    a3 = _work("a", 3)
    leaders, known = _lead(repeats, [a3])  # a's computation is still running
    assert leaders == [] and a3.served == "inflight"
    assert repeats.finish(a, Prediction(embedding=[1.0])) == [a, a2, a3]
    assert repeats.finish(b, None) == [b]


def test_a_finished_result_is_served_from_memory_until_stored() -> None:
    table: dict[bytes, bytes] = {}
    repeats = _repeats(table)
    leader = _work("a")
    assert _lead(repeats, [leader])[0] == [leader]
    prediction = Prediction(embedding=[2.0])
    repeats.finish(leader, prediction)
    twin = _work("a", 1)
    assert repeats.recall(twin) == Known(prediction=prediction, leader=leader)
    leaders, known = _lead(repeats, [twin])
    assert leaders == [] and known == [(twin, Known(prediction=prediction, leader=leader))]
    repeats.remember(leader, b"result")
    stored = repeats.recall(twin)
    assert stored is not None and stored.stored == b"result" and stored.prediction is None


def test_a_result_that_will_not_be_stored_is_forgotten_and_computed_again() -> None:
    table: dict[bytes, bytes] = {}
    repeats = _repeats(table)
    leader = _work("a")
    _lead(repeats, [leader])
    repeats.finish(leader, Prediction(embedding=[1.0]))
    repeats.forget(_work("a", 5))  # not the leader of the settled result: nothing happens
    assert repeats.recall(_work("a", 1)) is not None
    repeats.forget(leader)
    assert repeats.recall(_work("a", 1)) is None
    assert _lead(repeats, [again := _work("a", 2)])[0] == [again]
    assert table == {}


@pytest.mark.parametrize(
    "spoil",
    [lambda w: setattr(w, "storable", False), lambda w: setattr(w, "model", ("fallback", "1"))],
    ids=["clipped-text", "fallback-model"],
)
def test_a_result_that_may_not_be_reused_is_not_stored(spoil: Callable[[Work], None]) -> None:
    table: dict[bytes, bytes] = {}
    repeats = _repeats(table)
    leader = _work("a")
    _lead(repeats, [leader])
    spoil(leader)
    repeats.finish(leader, Prediction(embedding=[1.0]))
    repeats.remember(leader, b"result")
    assert table == {}
    assert repeats.recall(_work("a", 1)) is None


def test_an_unusable_stored_result_is_not_recalled_for_that_work_again() -> None:
    table: dict[bytes, bytes] = {}
    repeats = _repeats(table)
    leader = _work("a")
    _lead(repeats, [leader])
    repeats.finish(leader, Prediction(embedding=[1.0]))
    repeats.remember(leader, b"old version")
    work = _work("a", 1)
    assert repeats.recall(work) == Known(stored=b"old version")
    work.stored_unusable = True
    assert repeats.recall(work) is None
    assert _lead(repeats, [work])[0] == [work]


def test_the_store_write_runs_in_the_inputs_partition_and_a_failing_one_raises() -> None:
    writes: list[Any] = []

    def in_partition(token: Any, fn: Callable[[], None]) -> None:
        writes.append(token)
        fn()

    class _Broken(dict[bytes, bytes]):
        def __setitem__(self, key: bytes, value: bytes) -> None:
            raise OSError("No space left on device")

    repeats = _repeats({}, in_partition=in_partition)
    leader = _work("a", 7)
    _lead(repeats, [leader])
    repeats.finish(leader, Prediction(embedding=[1.0]))
    repeats.remember(leader, b"result")
    assert writes == [7]

    broken = _repeats(_Broken())
    leader = _work("b")
    _lead(broken, [leader])
    broken.finish(leader, Prediction(embedding=[1.0]))
    with pytest.raises(OSError):
        broken.remember(leader, b"result")
    assert broken.recall(_work("b", 1)) is None, "a result that failed to store is forgotten"


def test_without_a_store_only_memory_and_flights_dedupe() -> None:
    repeats = Repeats(None)
    leader = _work("a")
    assert repeats.recall(leader) is None
    _lead(repeats, [leader])
    repeats.finish(leader, Prediction(embedding=[1.0]))
    repeats.remember(leader, b"result")
    assert repeats.recall(_work("a", 1)) is None


class _Counting(dict[bytes, bytes]):
    """A store's table that counts its reads."""

    reads = 0

    def get(self, key: bytes, default: Any = None) -> Any:
        self.reads += 1
        return super().get(key, default)


def _store(repeats: Repeats, key: str, offset: int) -> None:
    leader = _work(key, offset)
    _lead(repeats, [leader])
    repeats.finish(leader, Prediction(embedding=[1.0]))
    repeats.remember(leader, f"result of {key}".encode())


def test_the_store_is_read_once_per_record_a_twin_stored_since_is_found_in_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pipeline.worker import repeats as module

    monkeypatch.setattr(module, "RECENT", 2)
    table = _Counting()
    repeats = _repeats(table)
    queued = _work("a", 0)
    assert repeats.recall(queued) is None and table.reads == 1  # at intake: a miss
    _store(repeats, "b", 1)  # another key stored meanwhile
    reads = table.reads
    assert _lead(repeats, [queued])[0] == [queued]
    assert table.reads == reads, "the store was asked again though the key was not stored since"
    repeats.finish(queued, None)

    twin = _work("c", 2)
    assert repeats.recall(twin) is None
    _store(repeats, "c", 3)  # its twin is stored while it waits
    reads = table.reads
    leaders, known = _lead(repeats, [twin])
    assert leaders == [] and known == [(twin, Known(stored=b"result of c"))]
    assert table.reads == reads, "the twin's result was written here: no read needed"

    old = _work("d", 4)
    assert repeats.recall(old) is None
    _store(repeats, "d", 5)  # its twin is stored, then more writes than are remembered
    for i, key in enumerate(("e", "f")):
        _store(repeats, key, 6 + i)
    reads = table.reads
    assert _lead(repeats, [old])[0] == [old], "forgotten since: computed again"
    assert table.reads == reads, "never a second store read for one record"


def test_memory_per_key_is_bounded_by_the_work_in_flight_whatever_the_distinct_keys() -> None:
    """50,000 distinct texts in batches of 32 (some repeating within a batch), each
    batch finished then stored, failed or not stored: the computations under way and
    the settled results hold only what is in flight (nothing once every batch is
    answered), and the keys remembered for re-reads at most RECENT."""
    from pipeline.worker.repeats import RECENT

    repeats = _repeats({})
    peak_flight = peak_settled = 0
    offset = 0
    for round_ in range(50_000 // 32):
        batch = []
        for i in range(32):
            key = f"text {round_}-{i // 2 if i % 8 == 0 else i}"  # a twin now and then
            batch.append(_work(key, offset))
            offset += 1
        leaders, _known = _lead(repeats, batch)
        peak_flight = max(peak_flight, len(repeats._flight))
        for n, leader in enumerate(leaders):
            failed = n % 10 == 9
            waiters = repeats.finish(leader, None if failed else Prediction(embedding=[1.0]))
            peak_settled = max(peak_settled, len(repeats._settled))
            if failed:
                continue
            if n % 10 == 8:
                repeats.forget(leader)  # its publish failed: not stored
            else:
                repeats.remember(leader, b"encoded")
            assert waiters[0] is leader
    assert len(repeats._flight) == 0 and len(repeats._settled) == 0
    assert 0 < peak_settled <= 32 and 0 < peak_flight <= 32
    assert len(repeats._recent) == RECENT
