"""The ledger: the one keeper of a lane record's offset and bounds, fetch to release."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, NamedTuple

from pipeline.settings import Settings
from pipeline.worker.ledger import Ledger
from pipeline.worker.records import Incoming, Origin

LANE_OF = {"lane.bulk": "bulk", "lane.realtime": "realtime"}


class TP(NamedTuple):
    topic: str
    partition: int


def _record(partition: int, offset: int) -> SimpleNamespace:
    return SimpleNamespace(
        topic="lane.bulk", partition=partition, offset=offset, key=None, value=b"v",
        tp=TP("lane.bulk", partition), timestamp=1.0,
    )  # fmt: skip


def _incoming(partition: int, offset: int, token: Any) -> Incoming:
    return Incoming("bulk", Origin("lane.bulk", partition, offset, 0, None, b"v"), token)


class _Rig:
    def __init__(self, **env: str) -> None:
        self.dropped: list[Any] = []
        self.passed_forgotten: list[Any] = []
        self.room = 0
        self.ledger = Ledger(
            Settings.from_env(env),
            LANE_OF,
            clock_ms=lambda: 0,
            forget=self.dropped.extend,
            forget_passed=self.passed_forgotten.append,
        )
        self.ledger.on_room = self._room

    def _room(self) -> None:
        self.room += 1


def test_revoking_a_partition_forgets_it_in_every_part_and_nothing_else() -> None:
    rig = _Rig()
    ledger = rig.ledger
    ledger.fetched([_record(0, o) for o in range(3)] + [_record(1, 0)])
    ledger.continuity.start_at(TP("lane.bulk", 0), 0)
    assert ledger.hold(_incoming(0, 10, "held-0")) and ledger.hold(_incoming(1, 10, "held-1"))
    assert ledger.revoked([TP("lane.bulk", 0)]) == 1  # one held input dropped
    assert [r.offset for r in rig.dropped] == [0, 1, 2]  # its buffered records: not waited for
    assert not ledger.buffer.holds(TP("lane.bulk", 0)) and ledger.buffer.holds(TP("lane.bulk", 1))
    assert not ledger.continuity.knows(TP("lane.bulk", 0))
    assert rig.passed_forgotten == [TP("lane.bulk", 0)]
    assert ledger.pending() == 1 and rig.room == 1  # partition 1's input is still held
    assert ledger.release(Origin("lane.bulk", 1, 10, 0, None, b"v")) == ["held-1"]


def test_giving_up_abandons_the_unstarted_and_everything_buffered() -> None:
    rig = _Rig()
    ledger = rig.ledger
    for offset in range(4):
        assert ledger.hold(_incoming(0, offset, f"t{offset}"))
    ledger.fetched([_record(0, 4), _record(0, 5)])
    stranded, dropped = ledger.give_up([_incoming(0, 2, "t2")])
    assert (stranded, dropped) == (2, 2)  # 2 and 3 behind it; two buffered records
    assert rig.dropped[:2] == ["t2", "t3"] and [r.offset for r in rig.dropped[2:]] == [4, 5]
    assert ledger.release(Origin("lane.bulk", 0, 0, 0, None, b"v")) == ["t0"]
    assert not ledger.hold(_incoming(0, 6, "t6"))  # behind an abandoned offset: refused
    assert rig.dropped[-1] == "t6"  # and the consumer is told not to wait for it


def test_a_lane_at_its_bound_has_room_again_once_an_input_is_released() -> None:
    rig = _Rig(PIPELINE_BATCH_MAX_INFLIGHT="2")
    ledger = rig.ledger
    assert ledger.hold(_incoming(0, 0, "a")) and ledger.hold(_incoming(0, 1, "b"))
    assert not ledger.has_room("bulk", 1) and ledger.has_room("realtime", 1)
    assert ledger.release(Origin("lane.bulk", 0, 1, 0, None, b"v")) == []  # 0 holds it back
    assert ledger.has_room("bulk", 1) and rig.room == 1
