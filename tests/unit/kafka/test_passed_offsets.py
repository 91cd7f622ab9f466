"""The offsets the fetcher walked past without a record: noted, merged, pruned, bounded."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.kafka.faust_edge.passed import MAX_RANGES, PassedOffsets

TP = ("lane", 0)


@dataclass
class _Record:
    offset: int


def _records(*offsets: int) -> list[_Record]:
    return [_Record(o) for o in offsets]


def test_a_contiguous_getall_notes_nothing() -> None:
    passed = PassedOffsets({"lane"})
    passed.note(TP, 10, _records(10, 11, 12), 13)
    assert passed.ranges(TP) == []
    assert not passed.explains(TP, 10, 10)


def test_markers_between_records_and_after_the_last_are_noted() -> None:
    """A fetch from 10: records 10, 11, an aborted transaction 12..14 and its marker
    15, record 16, a commit marker 17 (the position ends at 18)."""
    passed = PassedOffsets({"lane"})
    passed.note(TP, 10, _records(10, 11, 16), 18)
    assert passed.ranges(TP) == [(12, 15), (17, 17)]
    assert passed.explains(TP, 12, 15)
    assert not passed.explains(TP, 11, 15)  # 11 held a record
    assert passed.explains(TP, 17, 17)


def test_a_getall_of_markers_alone_is_noted() -> None:
    """A fetch whose data is a control batch only: nothing handed over, the position
    moved past it (the partition ends in a marker)."""
    passed = PassedOffsets({"lane"})
    passed.note(TP, 20, [], 21)
    assert passed.explains(TP, 20, 20)


def test_ranges_noted_by_consecutive_getalls_merge() -> None:
    passed = PassedOffsets({"lane"})
    passed.note(TP, 0, _records(0), 3)  # 1..2
    passed.note(TP, 3, [], 5)  # 3..4
    passed.note(TP, 5, _records(6), 7)  # 5
    assert passed.ranges(TP) == [(1, 5)]
    assert passed.explains(TP, 1, 5)
    passed.note(TP, 0, _records(0), 2)  # read again after a seek back: 1, already there
    assert passed.ranges(TP) == [(1, 5)]


def test_other_topics_and_partitions_are_not_noted_or_mixed() -> None:
    passed = PassedOffsets({"lane"})
    passed.note(("changelog", 0), 0, [], 5)
    passed.note(("lane", 1), 0, [], 5)
    assert passed.ranges(("changelog", 0)) == []
    assert not passed.explains(TP, 0, 4)
    assert passed.explains(("lane", 1), 0, 4)


def test_ranges_below_the_offset_asked_about_are_dropped() -> None:
    passed = PassedOffsets({"lane"})
    for marker in range(1, 100, 2):  # a marker after every record
        passed.note(TP, marker - 1, _records(marker - 1), marker + 1)
    assert len(passed.ranges(TP)) == 50
    assert passed.explains(TP, 51, 51)
    assert passed.ranges(TP)[0] == (51, 51)
    assert len(passed.ranges(TP)) == 25


def test_the_ranges_kept_per_partition_are_bounded() -> None:
    """A reader that never asks (say, a partition whose records wait) keeps at most
    MAX_RANGES; losing the oldest only costs a seek back, never a record."""
    passed = PassedOffsets({"lane"})
    for marker in range(1, 4 * MAX_RANGES, 2):
        passed.note(TP, marker - 1, _records(marker - 1), marker + 1)
    ranges = passed.ranges(TP)
    assert len(ranges) == MAX_RANGES
    assert ranges[-1] == (4 * MAX_RANGES - 1, 4 * MAX_RANGES - 1)
    assert not passed.explains(TP, 1, 1)  # dropped: the reader would seek instead


def test_a_revoked_partition_is_forgotten() -> None:
    passed = PassedOffsets({"lane"})
    passed.note(TP, 0, [], 3)
    passed.forget(TP)
    assert passed.ranges(TP) == []
