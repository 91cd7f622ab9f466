"""Admission: lane bounds in records and bytes, ordered release, giving up on a rebalance."""

from __future__ import annotations

import asyncio
from typing import Any

from pipeline.worker.admission import Admission, LaneBounds


class _Clock:
    def __init__(self) -> None:
        self.ms = 0

    def __call__(self) -> int:
        return self.ms


def _admission(records: int = 10, nbytes: int = 1000) -> Admission[str]:
    return Admission(("realtime", "bulk"), LaneBounds(records, nbytes), clock_ms=_Clock())


def test_release_returns_a_contiguous_prefix_in_offset_order() -> None:
    adm = _admission()

    async def scenario() -> list[list[str]]:
        for offset in (0, 1, 2):
            assert await adm.admit("bulk", "p", offset, 10, f"t{offset}")
        return [adm.release("p", 2), adm.release("p", 0), adm.release("p", 1)]

    assert asyncio.run(scenario()) == [[], ["t0"], ["t1", "t2"]]
    assert adm.pending() == 0 and adm.held_bytes("bulk") == 0


def test_a_lane_at_its_byte_bound_waits_and_other_lanes_do_not() -> None:
    adm = _admission(records=100, nbytes=1000)

    async def scenario() -> tuple[bool, bool, bool]:
        assert await adm.admit("bulk", "b", 0, 600, "b0")
        second = asyncio.ensure_future(adm.admit("bulk", "b", 1, 600, "b1"))
        realtime = await asyncio.wait_for(adm.admit("realtime", "r", 0, 600, "r0"), 5)
        await asyncio.sleep(0)
        waited = not second.done()
        adm.release("b", 0)
        return waited, realtime, await asyncio.wait_for(second, 5)

    assert asyncio.run(scenario()) == (True, True, True)
    assert adm.held_bytes("bulk") == 600


def test_a_record_larger_than_the_byte_bound_gets_in_alone() -> None:
    adm = _admission(records=100, nbytes=1000)

    async def scenario() -> tuple[bool, bool]:
        big = await asyncio.wait_for(adm.admit("bulk", "b", 0, 5000, "big"), 5)
        after = asyncio.ensure_future(adm.admit("bulk", "b", 1, 1, "small"))
        await asyncio.sleep(0)
        waited = not after.done()
        adm.release("b", 0)
        await asyncio.wait_for(after, 5)
        return big, waited

    assert asyncio.run(scenario()) == (True, True)


def test_a_lane_at_its_record_bound_waits() -> None:
    adm = _admission(records=2, nbytes=10**9)

    async def scenario() -> bool:
        for offset in (0, 1):
            await adm.admit("bulk", "b", offset, 1, str(offset))
        third = asyncio.ensure_future(adm.admit("bulk", "b", 2, 1, "2"))
        await asyncio.sleep(0)
        waited = not third.done()
        adm.release("b", 1)
        await asyncio.wait_for(third, 5)
        return waited

    assert asyncio.run(scenario()) is True


def test_giving_up_wakes_waiters_and_strands_everything_after_the_first_unstarted() -> None:
    adm = _admission(records=5, nbytes=10**9)

    async def scenario() -> tuple[list[str], bool, list[str], list[str]]:
        for offset in range(5):
            await adm.admit("bulk", "p", offset, 1, f"t{offset}")
        waiter = asyncio.ensure_future(adm.admit("bulk", "p", 5, 1, "t5"))
        await asyncio.sleep(0)
        # 0 and 1 are running, 2 and 4 are queued (unstarted), 3 is running.
        stranded = adm.give_up([("p", 2), ("p", 4)])
        admitted = await asyncio.wait_for(waiter, 5)
        early = adm.release("p", 0) + adm.release("p", 1)
        late = adm.release("p", 3)  # answered, but behind an abandoned offset
        return stranded, admitted, early, late

    stranded, admitted, early, late = asyncio.run(scenario())
    assert stranded == ["t2", "t3", "t4"]
    assert admitted is False
    assert early == ["t0", "t1"]
    assert late == []
    assert adm.held_records("bulk") == 0  # nothing holds room any more
    assert adm.forget("p") == 3  # 2, 3 and 4 were never released: read again


def test_after_giving_up_a_partition_takes_nothing_more_until_it_is_forgotten() -> None:
    """A record of a given-up partition arriving after the give-up (Faust delivers what
    it buffered until it suspends its streams) could never be released behind the
    abandoned offset: it is refused, so the caller tells Faust not to wait for it."""
    adm = _admission()

    async def scenario() -> list[bool]:
        await adm.admit("bulk", "p", 0, 1, "p0")
        await adm.admit("bulk", "q", 0, 1, "q0")
        adm.give_up([("p", 0)])
        late = await adm.admit("bulk", "p", 1, 1, "p1")
        other = await adm.admit("bulk", "q", 1, 1, "q1")
        adm.forget("p")
        again = await adm.admit("bulk", "p", 0, 1, "p0 again")
        return [late, other, again]

    assert asyncio.run(scenario()) == [False, True, True]


def test_a_rewound_partition_starts_over_and_oldest_counts_from_admission() -> None:
    clock = _Clock()
    adm: Admission[str] = Admission(("bulk",), LaneBounds(10, 10**6), clock_ms=clock)

    async def scenario() -> None:
        await adm.admit("bulk", "p", 7, 1, "a")
        clock.ms = 500
        await adm.admit("bulk", "p", 3, 1, "b")  # handed back from its last commit

    asyncio.run(scenario())
    assert adm.pending() == 1 and adm.held_records("bulk") == 1
    clock.ms = 800
    assert adm.oldest_ms() == 300


def test_the_worker_core_gives_up_queued_work_and_waits_only_for_the_running_batch() -> None:
    """Runtime.give_up_unstarted: queued inputs are abandoned (Faust is told to stop
    waiting for them and for every later offset), the running batch is answered, and
    only the offsets before the first abandoned one are released."""
    from support.runtime import LengthEngine

    from pipeline.client import request_bytes
    from pipeline.publish import Publisher
    from pipeline.settings import Settings
    from pipeline.worker import Incoming, Origin, Runtime

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
            forget=forgotten.extend,
        )
        loop = asyncio.ensure_future(runtime.run())
        for offset in range(2):
            _rid, value = request_bytes(f"text number {offset}", request_id=f"r-{offset}")
            origin = Origin("lane.bulk", 0, offset, 0, None, value)
            assert await runtime.submit(Incoming("bulk", origin, token=offset))
        await asyncio.wait_for(engine.started.wait(), 10)  # offsets 0 and 1 are running
        for offset in range(2, 6):
            _rid, value = request_bytes(f"text number {offset}", request_id=f"r-{offset}")
            origin = Origin("lane.bulk", 0, offset, 0, None, value)
            assert await runtime.submit(Incoming("bulk", origin, token=offset))
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
