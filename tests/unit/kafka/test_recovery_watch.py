"""The watch on Faust's recovery of the stored results (faust_edge/recovery_watch.py).

The recovery is Faust's own ``Recovery`` (of an app that never connects), set as a
rebalance leaves it; the consumer's seek and position are recorded stand-ins.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, cast

import faust
import pytest
from faust.types import TP

from pipeline.kafka.faust_edge.recovery_watch import READINGS, RecoveryWatch, stalled

CL2, CL3, CL0 = TP("dedupe-changelog", 2), TP("dedupe-changelog", 3), TP("dedupe-changelog", 0)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Consumer:
    """Records the watch's seeks; ``position`` answers ``at`` (or raises it)."""

    def __init__(self, at: int | Exception = 56) -> None:
        self.seeks: list[dict[Any, int]] = []
        self.at = at

    async def seek_wait(self, partitions: Mapping[Any, int]) -> None:
        self.seeks.append(dict(partitions))

    async def position(self, tp: Any) -> int | None:
        if isinstance(self.at, Exception):
            raise self.at
        return self.at


def _recovery(started_at: float = 100.0) -> Any:
    """Faust's Recovery as a rebalance leaves it: CL2 needs offsets 9..55, CL3 is
    restored, CL0 is a standby (no lane waits on it)."""
    app = faust.App("recovery-watch-test", broker="kafka://127.0.0.1:1", store="memory://")
    r = cast(Any, app.tables).recovery
    for tp, offset, highwater in ((CL2, 9, 55), (CL3, 40, 40)):
        r.active_tps.add(tp)
        r.active_offsets[tp] = offset
        r.active_highwaters[tp] = highwater
    r.standby_tps.add(CL0)
    r.standby_offsets[CL0] = 0
    r.standby_highwaters[CL0] = 30
    r._set_recovery_started()
    r._recovery_started_at = started_at
    return r


def _watch(r: Any, clock: _Clock, consumer: _Consumer, **kw: Any) -> RecoveryWatch:
    return RecoveryWatch(r, consumer.seek_wait, consumer.position, stall_s=10.0, clock=clock, **kw)


def test_a_stalled_partition_is_read_again_then_let_go_and_the_recovery_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        r, clock, consumer = _recovery(), _Clock(), _Consumer(at=56)
        actions: list[str] = []
        watch = _watch(r, clock, consumer, on_action=actions.append)
        clock.now = 109.9
        assert await watch.check() == []  # quiet for less than stall_s
        for _ in range(READINGS):
            clock.now += 10.1
            assert await watch.check() == [(CL2, "read-again")]
            assert consumer.seeks[-1] == {CL2: 9}
            clock.now += 5.0
            assert await watch.check() == []  # one action per stall_s
        assert r.in_recovery and not r.signal_recovery_end.is_set()
        clock.now += 10.1
        assert await watch.check() == [(CL2, "let-go")]
        assert r.active_offsets[CL2] == 55
        assert not r.in_recovery
        assert r.signal_recovery_end.is_set()
        assert len(consumer.seeks) == READINGS  # the standby and CL3 never sought
        assert actions == ["read-again"] * READINGS + ["let-go"]

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    lines = [rec.getMessage() for rec in caplog.records]
    assert "dedupe-changelog[2]" in lines[0] and "consumer at 56" in lines[0]
    assert "reading it again from 9" in lines[0]
    assert "results of offsets 10..55 are not restored" in lines[-1]


def test_a_partition_receiving_records_is_let_be() -> None:
    async def main() -> None:
        r, clock, consumer = _recovery(), _Clock(), _Consumer()
        watch = _watch(r, clock, consumer)
        for _ in range(5):
            clock.now += 8.0
            r._active_events_received_at[CL2] = clock.now - 1.0  # a record a second ago
            r.active_offsets[CL2] += 3
            assert await watch.check() == []
        assert consumer.seeks == []
        assert r.in_recovery

    asyncio.run(main())


def test_a_new_recovery_counts_its_readings_afresh() -> None:
    async def main() -> None:
        r, clock, consumer = _recovery(), _Clock(), _Consumer()
        watch = _watch(r, clock, consumer)
        for _ in range(READINGS):
            clock.now += 10.1
            assert await watch.check() == [(CL2, "read-again")]
        r._recovery_started_at = clock.now  # the next rebalance's recovery
        clock.now += 10.1
        assert await watch.check() == [(CL2, "read-again")]

    asyncio.run(main())


def test_nothing_is_done_outside_a_recovery() -> None:
    async def main() -> None:
        r, clock, consumer = _recovery(), _Clock(), _Consumer()
        r._set_recovery_ended()
        clock.now += 100.0
        assert await _watch(r, clock, consumer).check() == []
        assert consumer.seeks == []

    asyncio.run(main())


def test_a_position_or_seek_that_fails_still_acts_and_the_log_says_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class _Refusing(_Consumer):
        async def seek_wait(self, partitions: Mapping[Any, int]) -> None:
            raise RuntimeError("revoked meanwhile")

    async def main() -> None:
        r, clock = _recovery(), _Clock()
        consumer = _Refusing(at=TimeoutError())
        watch = _watch(r, clock, consumer)
        clock.now += 10.1
        assert await watch.check() == [(CL2, "read-again")]

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    assert "the consumer at None" in caplog.records[0].getMessage()


def test_nothing_judged_in_one_recovery_is_done_to_the_next_or_after_a_record() -> None:
    """The position is read (for the log) before acting: a recovery that restarted, or
    a record that came, meanwhile makes the stall moot."""

    class _Meanwhile(_Consumer):
        def __init__(self, r: Any, happen: Any) -> None:
            super().__init__()
            self.r, self.happen, self.armed = r, happen, False

        async def position(self, tp: Any) -> int | None:
            if self.armed:
                self.happen(self.r)
            return 56

    def restart(r: Any) -> None:
        r._recovery_started_at += 50.0
        r.active_highwaters[CL2] = 80

    def record(r: Any) -> None:
        r.active_offsets[CL2] += 1

    async def main(happen: Any) -> tuple[list[tuple[TP, str]], Any]:
        r, clock = _recovery(), _Clock()
        consumer = _Meanwhile(r, happen)
        watch = _watch(r, clock, consumer)
        for _ in range(READINGS):  # its readings spent: the next stall would let go
            clock.now += 10.1
            assert await watch.check() == [(CL2, "read-again")]
        consumer.armed = True
        clock.now += 10.1
        return await watch.check(), r

    for happen, offset in ((restart, 9), (record, 10)):
        done, r = asyncio.run(main(happen))
        assert done == []
        assert r.active_offsets[CL2] == offset and r.in_recovery
        assert not r.signal_recovery_end.is_set()


def test_stalled_counts_from_the_latest_of_start_event_and_action() -> None:
    remaining = {CL2: 46, CL3: 0, CL0: -1}

    def at(now: float, event: float | None = None, action: float | None = None) -> list[TP]:
        return stalled(
            now,
            100.0,
            remaining,
            last_event_at={} if event is None else {CL2: event},
            last_action_at={} if action is None else {CL2: action},
            stall_s=10.0,
        )

    assert at(110.0) == [CL2]
    assert at(109.0) == []
    assert at(115.0, event=106.0) == []
    assert at(115.0, action=106.0) == []
    assert at(116.0, event=106.0, action=101.0) == [CL2]
    # An event from before this recovery's start does not count as recent.
    assert at(110.0, event=50.0) == [CL2]
