"""The worker's intake of lane records: the buffer each fetch lands in
(:class:`LaneBuffer`) and the reader that takes them from there into the runtime
(:class:`LaneReader`), realtime first, in chunks.

The buffer is tested alone (it is pure). The reader runs over a real
:class:`Runtime`: the model is a stand-in that embeds a text as its length, the
broker a send function that acknowledges at once, and the Kafka consumer the
four callables of :class:`Consumer`, which record what they are asked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from types import SimpleNamespace
from typing import Any, NamedTuple

from support.runtime import InstantBroker, LengthEngine, settle

from pipeline.kafka.client import request_bytes
from pipeline.settings import Settings
from pipeline.worker.admission import LaneBounds
from pipeline.worker.continuity import Continuity
from pipeline.worker.lane_buffer import SKIP, STOP, TAKEN, LaneBuffer
from pipeline.worker.lane_reader import CHUNK, Consumer, LaneReader
from pipeline.worker.ledger import Ledger
from pipeline.worker.records import Incoming
from pipeline.worker.runtime import Runtime

LANE_OF = {"lane.realtime": "realtime", "lane.standard": "standard", "lane.bulk": "bulk"}
RT, STD, BULK = "lane.realtime", "lane.standard", "lane.bulk"


class TP(NamedTuple):
    """A topic partition, as Faust names one (``tp.topic``, ``tp.partition``)."""

    topic: str
    partition: int


def record(topic: str, partition: int, offset: int, value: bytes = b"v") -> SimpleNamespace:
    """A fetched record as the consumer hands it over."""
    return SimpleNamespace(
        topic=topic,
        partition=partition,
        offset=offset,
        key=None,
        value=value,
        tp=TP(topic, partition),
        timestamp=1.0,
    )


def request(topic: str, partition: int, offset: int) -> SimpleNamespace:
    """A record whose value is a real request; its request id names its place."""
    _rid, value = request_bytes(
        f"text of {topic}[{partition}]@{offset}", request_id=f"{topic}/{partition}/{offset}"
    )
    return record(topic, partition, offset, value)


def rid(r: SimpleNamespace) -> str:
    return f"{r.topic}/{r.partition}/{r.offset}"


# -- the buffer ----------------------------------------------------------------


class _Fetcher:
    """Records the buffer's pause and resume calls."""

    def __init__(self) -> None:
        self.paused: list[TP] = []
        self.resumed: list[TP] = []

    def buffer(self, max_records: int = 1000, max_bytes: int = 10**6) -> LaneBuffer:
        return LaneBuffer(
            LANE_OF,
            LaneBounds(max_records, max_bytes),
            pause=self.paused.append,
            resume=self.resumed.append,
        )


def _taker(shown: list[SimpleNamespace], verdict: Callable[[Any], int] = lambda r: TAKEN) -> Any:
    def take(r: Any) -> int:
        shown.append(r)
        return verdict(r)

    return take


def _places(records: Iterable[Any]) -> list[tuple[int, int]]:
    return [(r.partition, r.offset) for r in records]


def test_each_partitions_records_are_drained_in_offset_order_up_to_the_limit() -> None:
    buf = _Fetcher().buffer()
    # two partitions' records interleaved, as one fetch may hand them over
    buf.put([record(STD, p, o) for o in range(5) for p in (0, 1)])
    assert buf.pending() == buf.pending("standard") == 10
    assert buf.pending("bulk") == buf.pending("realtime") == 0
    shown: list[SimpleNamespace] = []
    assert buf.drain("standard", _taker(shown), 3) == 3
    assert buf.pending("standard") == 7
    assert buf.drain("standard", _taker(shown), 100) == 7
    assert buf.pending() == 0
    for p in (0, 1):
        assert [r.offset for r in shown if r.partition == p] == [0, 1, 2, 3, 4]
    assert _places(shown[:3]) == [(0, 0), (0, 1), (0, 2)]


def test_a_skipped_record_keeps_its_partitions_records_and_the_others_are_taken() -> None:
    buf = _Fetcher().buffer()
    buf.put([record(STD, 0, o) for o in range(3)] + [record(STD, 1, o) for o in range(3)])
    shown: list[SimpleNamespace] = []
    taken = buf.drain("standard", _taker(shown, lambda r: SKIP if r.partition == 0 else TAKEN), 100)
    assert taken == 3
    # partition 0 was shown its first record only, and kept all of them
    assert _places(shown) == [(0, 0), (1, 0), (1, 1), (1, 2)]
    assert buf.pending("standard") == 3
    again: list[SimpleNamespace] = []
    assert buf.drain("standard", _taker(again), 100) == 3
    assert _places(again) == [(0, 0), (0, 1), (0, 2)]


def test_partitions_of_a_lane_take_turns_while_room_is_scarce() -> None:
    """A partition refilled by every fetch does not starve the lane's other partitions
    when each drain can take only one record."""
    buf = _Fetcher().buffer()
    buf.put([record(STD, 0, 0), record(STD, 0, 1), record(STD, 1, 0)])
    got: list[tuple[int, int]] = []
    for offset in range(2, 42):
        shown: list[SimpleNamespace] = []
        buf.drain("standard", _taker(shown), 1)
        got += _places(shown)
        buf.put([record(STD, 0, offset)])  # partition 0 is fetched again every time
    assert (1, 0) in got[:2]
    per_partition = {p: [o for q, o in got if q == p] for p in (0, 1)}
    assert per_partition[0] == sorted(per_partition[0])


def test_stop_ends_the_lane_and_keeps_the_record_it_was_said_of() -> None:
    buf = _Fetcher().buffer()
    buf.put([record(STD, 0, o) for o in range(3)] + [record(STD, 1, o) for o in range(3)])
    shown: list[SimpleNamespace] = []
    taken = buf.drain("standard", _taker(shown, lambda r: STOP if r.offset == 1 else TAKEN), 100)
    assert taken == 1
    assert _places(shown) == [(0, 0), (0, 1)]  # nothing of partition 1 was shown
    again: list[SimpleNamespace] = []
    assert buf.drain("standard", _taker(again), 100) == 5
    # Partition 0 was served before the stop: partition 1 goes first now, and partition
    # 0 resumes at the record the stop was said of.
    assert _places(again) == [(1, 0), (1, 1), (1, 2), (0, 1), (0, 2)]


def test_a_lane_over_its_record_bound_pauses_its_partitions_until_down_to_half() -> None:
    fetcher = _Fetcher()
    buf = fetcher.buffer(max_records=4)
    buf.put([record(BULK, 0, 0), record(BULK, 1, 0), record(BULK, 0, 1), record(BULK, 1, 1)])
    assert fetcher.paused == []  # at the bound, not over it
    buf.put([record(BULK, 2, 0)])
    assert sorted(fetcher.paused) == [TP(BULK, 0), TP(BULK, 1), TP(BULK, 2)]
    # another fetch of records already fetched: accepted, paused once only
    buf.put([record(BULK, 0, 2), record(STD, 0, 0)])
    assert len(fetcher.paused) == 3
    assert buf.pending("bulk") == 6
    assert TP(STD, 0) not in fetcher.paused  # another lane's bound is its own
    assert buf.drain("bulk", _taker([]), 3) == 3  # 3 left: more than half of 4
    assert fetcher.resumed == []
    assert buf.drain("bulk", _taker([]), 1) == 1  # 2 left: half
    assert sorted(fetcher.resumed) == sorted(fetcher.paused)
    assert buf.drain("bulk", _taker([]), 100) == 2
    assert len(fetcher.resumed) == 3


def test_a_lane_over_its_byte_bound_pauses_until_down_to_half() -> None:
    fetcher = _Fetcher()
    buf = fetcher.buffer(max_records=1000, max_bytes=100)
    buf.put([record(BULK, 0, 0, b"x" * 40), record(BULK, 0, 1, b"x" * 40)])
    assert fetcher.paused == []
    buf.put([record(BULK, 1, 0, b"x" * 150)])  # one big record
    assert sorted(fetcher.paused) == [TP(BULK, 0), TP(BULK, 1)]
    assert buf.drain("bulk", _taker([]), 2) == 2  # 150 bytes left: more than half
    assert fetcher.resumed == []
    assert buf.drain("bulk", _taker([]), 1) == 1
    assert sorted(fetcher.resumed) == [TP(BULK, 0), TP(BULK, 1)]
    assert buf.pending() == 0


def test_drop_and_clear_hand_back_the_records_and_resume_their_partitions() -> None:
    fetcher = _Fetcher()
    buf = fetcher.buffer(max_records=2)
    a, b = [record(BULK, 0, o) for o in range(3)], [record(BULK, 1, o) for o in range(2)]
    rt = [record(RT, 0, 0)]
    buf.put(a + b + rt)
    assert sorted(fetcher.paused) == [TP(BULK, 0), TP(BULK, 1)]
    assert buf.drop([TP(BULK, 0)]) == a
    assert fetcher.resumed == [TP(BULK, 0)]
    assert (buf.pending(), buf.pending("bulk"), buf.pending("realtime")) == (3, 2, 1)
    assert buf.drop([TP(BULK, 0)]) == []  # nothing left of it
    assert fetcher.resumed == [TP(BULK, 0)]
    left = buf.clear()
    assert sorted(_places(left)) == [(0, 0), (1, 0), (1, 1)]
    assert {r.topic for r in left} == {BULK, RT}
    assert fetcher.resumed == [TP(BULK, 0), TP(BULK, 1)]
    assert buf.pending() == 0
    assert buf.clear() == []


# -- the reader over a real runtime ---------------------------------------------


class _Runtime(Runtime):
    """The real runtime; ``taken`` lists what it took, in order (an observer only)."""

    taken: list[tuple[str, int, int]]

    def take(self, incoming: Incoming) -> bool:
        o = incoming.origin
        self.taken.append((o.topic, o.partition, o.offset))
        return super().take(incoming)


class _Rig:
    """A reader feeding a runtime; the consumer's callables record what they are asked.

    ``starts`` gives a partition's start offset (default 0); a future there is
    awaited, so a test decides when the lookup returns.
    """

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.settings = Settings.from_env(
            {"PIPELINE_SCHEDULER_WINDOW_MS": "0", "PIPELINE_WORKER_EXPIRE_LANES": "", **(env or {})}
        )
        self.broker = InstantBroker()
        self.letters = self.broker.letters
        self.released: list[Any] = []
        self.forgotten: list[Any] = []
        self.seeks: list[tuple[Any, int]] = []
        self.lookups: list[tuple[str, int]] = []
        self.starts: dict[tuple[str, int], int | asyncio.Future[int | None] | None] = {}
        self.paused: list[Any] = []
        self.resumed: list[Any] = []
        self.positions: dict[Any, int] = {}  # the consumer's position per partition
        self.passed: list[tuple[Any, int, int]] = []  # pass_end calls
        self.ledger = Ledger(
            self.settings,
            LANE_OF,
            clock_ms=lambda: 0,
            pause=self.paused.append,
            resume=self.resumed.append,
            forget=self.forgotten.extend,
        )
        self.buffer = self.ledger.buffer
        self.reader = LaneReader(
            self.ledger,
            Consumer(
                seek=self._seek,
                add_gap=self._add_gap,
                start_offset=self._start_offset,
                position=self._position,
                pass_end=lambda tp, low, high: self.passed.append((tp, low, high)),
            ),
        )
        self.runtime = _Runtime(
            self.settings,
            engine=LengthEngine(),  # type: ignore[arg-type]
            publisher=self.broker.publisher(),
            ack=self._release,
            ledger=self.ledger,
            on_room=self.reader.wake,
        )
        self.runtime.taken = []
        self._tasks: list[asyncio.Future[None]] = []

    async def _seek(self, tp: Any, offset: int) -> None:
        self.seeks.append((tp, offset))

    async def _position(self, tp: Any) -> int | None:
        return self.positions.get(tp)

    async def _add_gap(self, tp: Any, low: int, high: int) -> None:
        raise AssertionError(f"no gap is expected here: {tp} {low}..{high}")

    async def _start_offset(self, tp: tuple[str, int]) -> int | None:
        self.lookups.append(tp)
        start = self.starts.get(tp, 0)
        if isinstance(start, asyncio.Future):
            return await start
        return start

    @property
    def results(self) -> list[str]:
        """The request ids of the results published, in the order they were sent."""
        return [str(result["request_id"]) for result in self.broker.results]

    async def _release(self, token: Any) -> None:
        self.released.append(token)

    def read(self) -> None:
        """Run the reader as a task."""
        self._tasks.append(asyncio.ensure_future(self.reader.run(self.runtime)))

    def batch(self) -> asyncio.Future[None]:
        """Run the runtime's batch loop as a task; return it (for :func:`settle`)."""
        self._tasks.append(asyncio.ensure_future(self.runtime.run()))
        return self._tasks[-1]

    def taken(self, topic: str | None = None) -> list[tuple[str, int, int]]:
        return [t for t in self.runtime.taken if topic is None or t[0] == topic]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.runtime.close(5.0)


async def until(
    done: Callable[[], bool], what: str, *, timeout_s: float = 10.0, poll_s: float = 0.002
) -> None:
    """Poll ``done`` (the event loop runs meanwhile) until it holds, or fail."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not done():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(poll_s)


def _run(body: Callable[[_Rig], Awaitable[None]], env: dict[str, str] | None = None) -> None:
    async def main() -> None:
        rig = _Rig(env)
        try:
            await body(rig)
        finally:
            await rig.close()

    asyncio.run(main())


def test_a_realtime_record_behind_a_bulk_backlog_waits_for_one_chunk_at_most() -> None:
    async def body(rig: _Rig) -> None:
        bulk = [request(BULK, 0, o) for o in range(300)]
        assert len(bulk) > 2 * CHUNK
        rig.buffer.put([*bulk, request(RT, 0, 0)])  # one fetch: realtime last
        # first pass: both starts unknown, nothing taken, each looked up once
        assert rig.reader._pass(rig.runtime) == 0
        await until(
            lambda: all(rig.reader.continuity.knows(TP(t, 0)) for t in (BULK, RT)), "the starts"
        )
        assert sorted(rig.lookups) == [(BULK, 0), (RT, 0)]
        assert rig.reader._pass(rig.runtime) == CHUNK
        assert rig.taken()[0] == (RT, 0, 0)
        assert rig.taken()[1:] == [(BULK, 0, o) for o in range(CHUNK - 1)]
        assert rig.runtime.scheduler.depth("realtime") == 1
        assert rig.runtime.scheduler.depth("bulk") == CHUNK - 1
        assert rig.runtime.counters["received"] == CHUNK
        assert rig.buffer.pending("bulk") == 300 - (CHUNK - 1)
        assert rig.buffer.pending("realtime") == 0

    _run(body)


def test_the_reader_takes_a_backlog_chunk_by_chunk_and_realtime_arriving_meanwhile_first() -> None:
    async def body(rig: _Rig) -> None:
        rig.reader.continuity.start_at(TP(RT, 0), 0)
        bulk = [request(BULK, 0, o) for o in range(300)]
        rig.buffer.put(bulk)
        rig.read()
        # polled at every turn of the loop: the reader yields after each chunk
        await until(lambda: rig.taken() != [], "the first chunk", poll_s=0)
        assert len(rig.taken()) == CHUNK
        rig.buffer.put([request(RT, 0, 0)])
        # no more arrivals nor freed room: the reader goes on by itself
        await until(lambda: len(rig.taken()) == 301, "the whole backlog")
        assert rig.taken().index((RT, 0, 0)) < 2 * CHUNK  # one chunk behind at most
        assert rig.taken(BULK) == [(BULK, 0, o) for o in range(300)]
        assert rig.buffer.pending() == 0

    _run(body)


def test_a_partition_waits_for_its_start_while_the_others_are_taken() -> None:
    async def body(rig: _Rig) -> None:
        loop = asyncio.get_running_loop()
        slow: asyncio.Future[int | None] = loop.create_future()
        gone: asyncio.Future[int | None] = loop.create_future()
        rig.starts[(STD, 0)] = slow
        rig.starts[(STD, 2)] = gone
        revoked = [request(STD, 2, o) for o in range(2)]
        rig.buffer.put([request(STD, 0, o) for o in range(3)] + [request(STD, 1, 0), *revoked])
        rig.read()
        await until(lambda: len(rig.taken()) == 1, "partition 1's record")
        assert rig.taken() == [(STD, 1, 0)]
        # more records of the waiting partitions arrive: still waiting, looked up once
        rig.buffer.put([request(STD, 0, 3), request(STD, 1, 1)])
        await until(lambda: len(rig.taken()) == 2, "partition 1's next record")
        assert rig.buffer.pending("standard") == 4 + 2
        assert sorted(rig.lookups) == [(STD, 0), (STD, 1), (STD, 2)]
        # partition 2 was revoked while looked up: its records are forgotten, never taken
        gone.set_result(None)
        await until(lambda: len(rig.forgotten) == 2, "partition 2's records forgotten")
        assert rig.forgotten == revoked
        assert rig.buffer.pending("standard") == 4
        slow.set_result(0)
        await until(lambda: len(rig.taken()) == 6, "partition 0's records")
        assert rig.taken() == [(STD, 1, 0), (STD, 1, 1)] + [(STD, 0, o) for o in range(4)]
        assert rig.buffer.pending() == 0
        assert len(rig.forgotten) == 2 and not rig.seeks
        assert sorted(rig.lookups) == [(STD, 0), (STD, 1), (STD, 2)]

    _run(body)


def test_a_record_past_the_expected_offset_is_sought_back_for_and_read_again() -> None:
    async def body(rig: _Rig) -> None:
        rig.read()
        batches = rig.batch()
        tp = TP(STD, 0)
        early = request(STD, 0, 3)  # offsets 0..2 were skipped by the consumer
        rig.buffer.put([early])
        await until(lambda: rig.seeks == [(tp, 0)], "the seek back to 0")
        assert rig.forgotten == [early]
        assert rig.taken() == []
        again = [request(STD, 0, o) for o in range(4)]
        rig.buffer.put(again)
        await settle(rig.runtime, batches, lambda: len(rig.released) == 4)
        assert rig.taken() == [(STD, 0, o) for o in range(4)]
        assert rig.results == [rid(r) for r in again]
        assert rig.released == again and rig.forgotten == [early]
        assert rig.seeks == [(tp, 0)] and rig.letters == []

    _run(body)


def test_a_full_lane_keeps_its_records_buffered_and_takes_them_once_room_is_freed() -> None:
    async def body(rig: _Rig) -> None:
        standard = [request(STD, p, o) for o in range(10) for p in (0, 1)]
        rig.buffer.put(standard)
        rig.read()  # no batch loop yet: nothing is answered yet: the lane fills up
        await until(lambda: len(rig.taken()) == 2, "the lane's two inputs")
        assert rig.buffer.pending("standard") == 18
        # another lane has room of its own
        urgent = request(RT, 0, 0)
        rig.buffer.put([urgent])
        await until(lambda: len(rig.taken()) == 3, "the realtime record")
        assert rig.taken()[-1] == (RT, 0, 0)
        assert rig.buffer.pending("standard") == 18
        # answers free room; the runtime wakes the reader, which takes the rest
        batches = rig.batch()
        every = [*standard, urgent]
        await settle(rig.runtime, batches, lambda: len(rig.released) == len(every))
        assert sorted(rig.results) == sorted(rid(r) for r in every)  # each once
        assert sorted(map(rid, rig.released)) == sorted(map(rid, every))
        for p in (0, 1):
            assert [t[2] for t in rig.taken(STD) if t[1] == p] == list(range(10))
        assert rig.buffer.pending() == 0
        assert rig.forgotten == [] and rig.letters == [] and rig.seeks == []

    _run(body, env={"PIPELINE_BATCH_MAX_INFLIGHT": "2"})


def test_offsets_passed_at_a_partitions_end_are_sought_for_then_passed() -> None:
    """The consumer's position is past the last record read and nothing is buffered:
    the reader seeks back (records dropped there come back), and after as many seeks as
    a hole needs with the same position and no record, the offsets are passed to the
    commit."""

    async def body(rig: _Rig) -> None:
        clock = [0.0]
        rig.ledger.continuity = Continuity(reseek_after_ms=2000, clock_ms=lambda: clock[0])
        rig.read()
        batches = rig.batch()
        tp = TP(STD, 0)
        rig.buffer.put([request(STD, 0, o) for o in range(3)])
        await until(lambda: len(rig.taken()) == 3, "three records")
        await rig.reader.check_ends()
        assert rig.seeks == []  # no position: nothing to judge
        rig.positions[tp] = 3
        await rig.reader.check_ends()
        assert rig.seeks == []  # at the next record: nothing passed
        rig.positions[tp] = 5  # two markers after offset 2
        await rig.reader.check_ends()
        await until(lambda: rig.seeks == [(tp, 3)], "the seek")
        clock[0] = 2000
        await rig.reader.check_ends()
        await until(lambda: len(rig.seeks) == 2, "the second seek")
        assert rig.seeks == [(tp, 3), (tp, 3)] and rig.passed == []
        clock[0] = 4000
        await rig.reader.check_ends()
        assert rig.passed == [(tp, 3, 4)]
        await rig.reader.check_ends()
        assert rig.passed == [(tp, 3, 4)] and len(rig.seeks) == 2
        rig.buffer.put([request(STD, 0, 5)])  # the next record, after the markers
        await settle(rig.runtime, batches, lambda: len(rig.released) == 4)
        assert rig.taken() == [(STD, 0, o) for o in (0, 1, 2, 5)]

    _run(body)


def test_a_stopping_reader_drops_what_is_buffered_and_what_arrives_after() -> None:
    """SIGTERM: the buffered records and every record fetched later are dropped (Faust
    stops waiting for them; read again after a restart), none is taken, and the
    offsets passed at a partition's end are left alone (those records were dropped on
    purpose)."""

    async def body(rig: _Rig) -> None:
        rig.read()
        tp = TP(STD, 0)
        rig.buffer.put([request(STD, 0, o) for o in range(2)])
        await until(lambda: len(rig.taken()) == 2, "two records")
        held = [request(STD, 0, o) for o in range(2, 5)]
        rig.buffer.put(held)
        rig.reader.stop()
        assert rig.ledger.give_up() == (0, 3)  # no await since the put: the reader took none
        late = [request(STD, 0, o) for o in range(5, 7)]
        rig.buffer.put(late)
        await until(lambda: rig.buffer.pending() == 0, "the late records dropped")
        assert len(rig.taken()) == 2
        assert {r.offset for r in rig.forgotten} >= {r.offset for r in held + late}
        rig.positions[tp] = 7
        await rig.reader.check_ends()
        assert rig.seeks == [] and rig.passed == []

    _run(body)
