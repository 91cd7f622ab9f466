"""Admission: lane bounds in records and bytes, ordered release, giving up on a rebalance."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pipeline.worker.admission import Admission, LaneBounds


class _Clock:
    def __init__(self) -> None:
        self.ms = 0

    def __call__(self) -> int:
        return self.ms


def _admission(
    records: int = 10, nbytes: int = 1000, on_room: Callable[[], None] = lambda: None
) -> Admission[str]:
    return Admission(
        ("realtime", "bulk"), LaneBounds(records, nbytes), clock_ms=_Clock(), on_room=on_room
    )


def test_release_returns_a_contiguous_prefix_in_offset_order() -> None:
    adm = _admission()
    for offset in (0, 1, 2):
        assert adm.hold("bulk", "p", offset, 10, f"t{offset}")
    assert [adm.release("p", 2), adm.release("p", 0), adm.release("p", 1)] == [
        [],
        ["t0"],
        ["t1", "t2"],
    ]
    assert adm.pending() == 0


def test_a_lane_at_its_byte_bound_is_full_until_a_release_and_other_lanes_are_not() -> None:
    freed: list[str] = []
    adm = _admission(records=100, nbytes=1000, on_room=lambda: freed.append("room"))
    assert adm.hold("bulk", "b", 0, 600, "b0")
    assert not adm.has_room("bulk", 600)
    assert adm.has_room("realtime", 600)
    assert adm.hold("realtime", "r", 0, 600, "r0")
    assert freed == []
    adm.release("b", 0)
    assert freed == ["room"]  # whoever waits for room is told
    assert adm.has_room("bulk", 600)
    assert adm.hold("bulk", "b", 1, 600, "b1")
    assert adm.has_room("bulk", 400) and not adm.has_room("bulk", 401)  # 600 of 1000 held


def test_a_record_larger_than_the_byte_bound_gets_in_alone() -> None:
    adm = _admission(records=100, nbytes=1000)
    assert adm.has_room("bulk", 5000)  # an empty lane takes anything
    assert adm.hold("bulk", "b", 0, 5000, "big")
    assert not adm.has_room("bulk", 1)
    adm.release("b", 0)
    assert adm.has_room("bulk", 1)


def test_a_lane_at_its_record_bound_is_full_until_a_release() -> None:
    adm = _admission(records=2, nbytes=10**9)
    for offset in (0, 1):
        assert adm.has_room("bulk", 1)
        assert adm.hold("bulk", "b", offset, 1, str(offset))
    assert not adm.has_room("bulk", 1)
    adm.release("b", 1)
    assert adm.has_room("bulk", 1)


def test_giving_up_frees_room_and_strands_everything_after_the_first_unstarted() -> None:
    freed: list[str] = []
    adm = _admission(records=5, nbytes=10**9, on_room=lambda: freed.append("room"))
    for offset in range(5):
        assert adm.hold("bulk", "p", offset, 1, f"t{offset}")
    assert not adm.has_room("bulk", 1)
    # 0 and 1 are running, 2 and 4 are queued (unstarted), 3 is running.
    stranded = adm.give_up([("p", 2), ("p", 4)])
    assert freed == ["room", "room"]
    assert adm.has_room("bulk", 1)
    assert adm.hold("bulk", "p", 5, 1, "t5") is False  # behind an abandoned offset
    early = adm.release("p", 0) + adm.release("p", 1)
    late = adm.release("p", 3)  # answered, but behind an abandoned offset
    assert stranded == ["t2", "t3", "t4"]
    assert early == ["t0", "t1"]
    assert late == []
    for offset in range(5):  # nothing holds room any more: the bound's 5 fit again
        assert adm.has_room("bulk", 1) and adm.hold("bulk", "q", offset, 1, f"q{offset}")
    assert adm.forget("p") == 3  # 2, 3 and 4 were never released: read again


def test_after_giving_up_a_partition_takes_nothing_more_until_it_is_forgotten() -> None:
    """A record of a given-up partition arriving after the give-up (Faust delivers what
    it buffered until it suspends its streams) could never be released behind the
    abandoned offset: it is refused, so the caller tells Faust not to wait for it."""
    adm = _admission()
    assert adm.hold("bulk", "p", 0, 1, "p0")
    assert adm.hold("bulk", "q", 0, 1, "q0")
    adm.give_up([("p", 0)])
    late = adm.hold("bulk", "p", 1, 1, "p1")
    other = adm.hold("bulk", "q", 1, 1, "q1")
    adm.forget("p")
    again = adm.hold("bulk", "p", 0, 1, "p0 again")
    assert [late, other, again] == [False, True, True]


def test_forgetting_a_partition_frees_its_room() -> None:
    freed: list[str] = []
    adm = _admission(records=2, nbytes=10**9, on_room=lambda: freed.append("room"))
    assert adm.hold("bulk", "p", 0, 1, "p0")
    assert adm.hold("bulk", "q", 0, 1, "q0")
    assert not adm.has_room("bulk", 1)
    assert adm.forget("p") == 1
    assert freed == ["room"]
    assert adm.has_room("bulk", 1) and adm.hold("bulk", "q", 1, 1, "q1")
    assert not adm.has_room("bulk", 1)  # q's two fill the bound of 2: p holds none


def test_a_rewound_partition_starts_over_and_oldest_counts_from_admission() -> None:
    clock = _Clock()
    adm: Admission[str] = Admission(("bulk",), LaneBounds(10, 10**6), clock_ms=clock)
    assert adm.hold("bulk", "p", 7, 1, "a")
    clock.ms = 500
    assert adm.hold("bulk", "p", 3, 1, "b")  # handed back from its last commit
    assert adm.pending() == 1
    clock.ms = 800
    assert adm.oldest_ms() == 300


def test_the_worker_core_gives_up_queued_work_and_waits_only_for_the_running_batch() -> None:
    """Runtime.give_up_unstarted: queued inputs are abandoned (Faust is told to stop
    waiting for them and for every later offset), the running batch is answered, and
    only the offsets before the first abandoned one are released."""
    from support.runtime import LengthEngine, submit

    from pipeline.kafka.client import request_bytes
    from pipeline.settings import Settings
    from pipeline.worker.ledger import Ledger
    from pipeline.worker.publish import Publisher
    from pipeline.worker.records import Incoming, Origin
    from pipeline.worker.runtime import Runtime

    class GatedEngine(LengthEngine):
        def __init__(self) -> None:
            super().__init__()
            self.gate = asyncio.Event()
            self.started = asyncio.Event()

        async def run(self, texts: list[str], **shape: int | None) -> Any:
            self.started.set()
            await self.gate.wait()
            return await super().run(texts, **shape)

    async def scenario() -> tuple[int, list[int], list[int], int]:
        released: list[int] = []
        forgotten: list[int] = []

        async def send(topic: str, key: bytes | None, value: bytes) -> asyncio.Future[None]:
            ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            ack.set_result(None)
            return ack

        async def ack(token: Any) -> None:
            released.append(token)

        settings = Settings.from_env(
            {"PIPELINE_SCHEDULER_MAX_ITEMS": "2", "PIPELINE_SCHEDULER_HANDOVER_MS": "-1"}
        )
        engine = GatedEngine()
        runtime = Runtime(
            settings,
            engine=engine,  # type: ignore[arg-type]
            publisher=Publisher(send, results_topic="res", dlq_topic="dlq"),
            ack=ack,
            ledger=Ledger(settings, {}, clock_ms=lambda: 0, forget=forgotten.extend),
        )
        loop = asyncio.ensure_future(runtime.run())
        for offset in range(2):
            _rid, value = request_bytes(f"text number {offset}", request_id=f"r-{offset}")
            origin = Origin("lane.bulk", 0, offset, 0, None, value)
            assert await submit(runtime, Incoming("bulk", origin, token=offset))
        await asyncio.wait_for(engine.started.wait(), 10)  # offsets 0 and 1 are running
        for offset in range(2, 6):
            _rid, value = request_bytes(f"text number {offset}", request_id=f"r-{offset}")
            origin = Origin("lane.bulk", 0, offset, 0, None, value)
            assert await submit(runtime, Incoming("bulk", origin, token=offset))
        abandoned = runtime.give_up_unstarted()
        engine.gate.set()
        deadline = asyncio.get_running_loop().time() + 10
        while len(released) < 2:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        loop.cancel()
        await runtime.close(5)
        return abandoned, released, forgotten, len(engine.batches)

    abandoned, released, forgotten, batches = asyncio.run(scenario())
    assert abandoned == 4
    assert released == [0, 1]
    assert forgotten == [2, 3, 4, 5]
    assert batches == 1  # nothing abandoned ran
