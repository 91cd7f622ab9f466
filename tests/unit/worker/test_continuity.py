"""Skipped lane records are noticed and fetched again; a hole is accepted only when
repeated seeks find the same first record past it."""

from __future__ import annotations

from pipeline.worker.continuity import SEEKS_BEFORE_ACCEPTING, Continuity, Verdict


def test_contiguous_records_are_processed() -> None:
    c = Continuity()
    assert all(c.check("p", o).process for o in range(5, 10))


def test_a_skip_seeks_back_skips_stale_records_then_resumes() -> None:
    c = Continuity()
    for o in range(0, 3):
        c.check("p", o)
    assert c.check("p", 7) == Verdict(process=False, seek_to=3)
    assert c.check("p", 8) == Verdict(process=False)  # buffered before the seek
    assert c.check("p", 3).process  # fetched again
    assert all(c.check("p", o).process for o in range(4, 10))


def test_a_real_hole_is_accepted_after_repeated_seeks_find_the_same_first_record() -> None:
    assert SEEKS_BEFORE_ACCEPTING == 2
    c = Continuity()
    c.check("p", 0)
    assert c.check("p", 5).seek_to == 1
    assert c.check("p", 6) == Verdict(process=False)  # buffered before the seek
    assert c.check("p", 5) == Verdict(process=False, seek_to=1)  # first after the seek
    assert c.check("p", 6) == Verdict(process=False)
    assert c.check("p", 5) == Verdict(process=True, accepted_hole=(1, 4))
    assert c.check("p", 6).process
    assert c.check("p", 9).seek_to == 7  # a new hole is questioned again


def test_a_seek_that_brings_back_part_of_the_hole_is_followed_to_the_start() -> None:
    c = Continuity()
    c.check("p", 0)
    assert c.check("p", 7).seek_to == 1
    # Offsets 1-2 do not come back, 3-6 do: the records from 3 on are not passed
    # over as if buffered; the hole is questioned from its start again.
    assert c.check("p", 3) == Verdict(process=False, seek_to=1)
    assert c.check("p", 3) == Verdict(process=True, accepted_hole=(1, 2))
    assert all(c.check("p", o).process for o in range(4, 9))


def test_a_lost_seek_is_redone_instead_of_stalling_the_partition() -> None:
    c = Continuity()
    for o in range(0, 3):
        c.check("p", o)
    assert c.check("p", 7).seek_to == 3
    assert c.check("p", 8) == Verdict(process=False)
    assert c.check("p", 9) == Verdict(process=False)
    # The stream starts over at 8 (the fetcher ignored the seek): seek again.
    assert c.check("p", 8) == Verdict(process=False, seek_to=3)
    assert c.check("p", 3).process
    assert all(c.check("p", o).process for o in range(4, 10))


def test_records_delivered_again_are_passed_over_until_revocation() -> None:
    c = Continuity()
    c.start_at("p", 3)
    assert c.check("p", 1) == Verdict(process=False)  # below the committed offset
    assert all(c.check("p", o).process for o in range(3, 11))
    assert c.check("p", 4) == Verdict(process=False)  # a second copy: answered already
    assert c.check("p", 11).process
    assert c.check("p", 14).seek_to == 12
    assert c.check("p", 5) == Verdict(process=False)  # older than the hole: stale
    assert c.check("p", 12).process  # what the seek was for
    c.forget("p")
    assert c.check("p", 50).process  # after revocation it may start anywhere
    assert c.check("q", 3).process  # partitions are independent


def test_a_hole_before_the_first_record_is_noticed_from_the_start_offset() -> None:
    c = Continuity()
    assert not c.knows("p")
    c.start_at("p", 18)
    assert c.knows("p")
    assert c.check("p", 128) == Verdict(process=False, seek_to=18)
    assert c.check("p", 18).process


class _Clock:
    def __init__(self) -> None:
        self.ms = 0.0

    def __call__(self) -> float:
        return self.ms


def test_a_seek_whose_records_never_come_back_is_redone_after_a_while() -> None:
    """The stream keeps delivering records past the hole (the seek was lost without a
    restart): they are passed over, and the seek is asked for again once overdue."""
    clock = _Clock()
    c = Continuity(reseek_after_ms=2000, clock_ms=clock)
    for o in range(0, 3):
        c.check("p", o)
    assert c.check("p", 7).seek_to == 3
    clock.ms = 1000
    assert c.check("p", 8) == Verdict(process=False)  # may still be buffered
    clock.ms = 2500
    assert c.check("p", 9) == Verdict(process=False, seek_to=3)
    assert c.check("p", 10) == Verdict(process=False)  # timed afresh from the new seek
    assert c.check("p", 3).process


def test_overdue_names_seeks_of_partitions_that_went_quiet() -> None:
    clock = _Clock()
    c = Continuity(reseek_after_ms=2000, clock_ms=clock)
    c.check("p", 0)
    c.check("q", 0)
    assert c.check("p", 5).seek_to == 1
    clock.ms = 1999
    assert c.overdue() == []
    clock.ms = 2000
    assert c.overdue() == [("p", 1)]
    assert c.overdue() == []  # timed afresh
    assert c.check("p", 1).process
    clock.ms = 10_000
    assert c.overdue() == []  # the hole was filled


def test_offsets_passed_at_the_end_are_sought_back_for_then_accepted() -> None:
    """A transaction's markers end the partition: no record follows them, but the
    consumer's position is past them."""
    clock = _Clock()
    c = Continuity(reseek_after_ms=2000, clock_ms=clock)
    for o in range(0, 3):
        c.check("p", o)
    assert c.at_end("p", 3) is None  # at the next record: nothing passed
    assert c.at_end("p", 5) == Verdict(process=False, seek_to=3)
    clock.ms = 1999
    assert c.at_end("p", 5) is None  # the seek had no time yet
    assert c.overdue() == []  # at_end times its own seeks
    clock.ms = 2000
    assert c.at_end("p", 3) is None  # sought back: the fetch is under way
    assert c.at_end("p", 5) == Verdict(process=False, seek_to=3)  # back at 5, no record
    clock.ms = 4000
    assert c.at_end("p", 5) == Verdict(process=False, accepted_hole=(3, 4))
    assert c.at_end("p", 5) is None
    assert c.check("p", 5).process  # the next record produced after the markers


def test_records_dropped_at_the_end_come_back_after_the_seek() -> None:
    clock = _Clock()
    c = Continuity(reseek_after_ms=2000, clock_ms=clock)
    c.check("p", 0)
    assert c.at_end("p", 4) == Verdict(process=False, seek_to=1)
    assert all(c.check("p", o).process for o in range(1, 4))  # fetched again, answered
    clock.ms = 5000
    assert c.at_end("p", 4) is None
    assert c.check("p", 2) == Verdict(process=False)  # a second copy


def test_a_record_after_a_hole_seen_at_the_end_is_judged_as_any_hole() -> None:
    """The timer saw the markers before the record after them arrived: that record
    carries on the count of seeks, and the hole is accepted as one before a record."""
    clock = _Clock()
    c = Continuity(reseek_after_ms=2000, clock_ms=clock)
    c.check("p", 0)
    assert c.at_end("p", 3) == Verdict(process=False, seek_to=1)
    assert c.check("p", 3) == Verdict(process=False, seek_to=1)  # first after the seek
    assert c.check("p", 3) == Verdict(process=True, accepted_hole=(1, 2))
    assert c.at_end("p", 4) is None


class _Log:
    """Offsets known to hold no record, as the fetcher notes them (PassedOffsets)."""

    def __init__(self, *ranges: tuple[int, int]) -> None:
        self.ranges = list(ranges)

    def __call__(self, partition: object, low: int, high: int) -> bool:
        return any(a <= low and high <= b for a, b in self.ranges)


def test_a_hole_the_log_explains_is_passed_at_once_without_a_seek() -> None:
    """A transaction's marker between two records: the fetch walked past it."""
    c = Continuity(explains=_Log((3, 3), (7, 9)))
    for o in range(0, 3):
        assert c.check("p", o).process
    assert c.check("p", 4) == Verdict(process=True, accepted_hole=(3, 3), explained=True)
    assert all(c.check("p", o).process for o in range(5, 7))
    assert c.check("p", 10) == Verdict(process=True, accepted_hole=(7, 9), explained=True)
    assert c.overdue() == []


def test_a_hole_only_partly_explained_is_sought_back_for_as_before() -> None:
    """Records Faust dropped (4..6) before a marker (7): the fetch handed them over, so
    they are not the log's to explain; the seek brings them back, then the marker is
    passed at once."""
    c = Continuity(explains=_Log((7, 7)))
    for o in range(0, 4):
        c.check("p", o)
    assert c.check("p", 8) == Verdict(process=False, seek_to=4)
    assert all(c.check("p", o).process for o in range(4, 7))  # fetched again
    assert c.check("p", 8) == Verdict(process=True, accepted_hole=(7, 7), explained=True)


def test_a_hole_explained_after_a_seek_ends_the_seek() -> None:
    """The note came with the fetch after the seek: the next record past the hole is
    taken (the seek counted nothing more)."""
    log = _Log()
    c = Continuity(explains=log)
    c.check("p", 0)
    assert c.check("p", 3) == Verdict(process=False, seek_to=1)
    log.ranges.append((1, 2))
    assert c.check("p", 3) == Verdict(process=True, accepted_hole=(1, 2), explained=True)
    assert c.overdue() == []


def test_markers_at_the_end_the_log_explains_are_passed_without_a_seek() -> None:
    clock = _Clock()
    c = Continuity(reseek_after_ms=2000, clock_ms=clock, explains=_Log((3, 4)))
    for o in range(0, 3):
        c.check("p", o)
    assert c.at_end("p", 5) == Verdict(process=False, accepted_hole=(3, 4), explained=True)
    assert c.at_end("p", 5) is None
    assert c.check("p", 5).process


def test_an_unexplained_end_is_still_sought_back_for() -> None:
    c = Continuity(explains=_Log((4, 4)))
    c.check("p", 0)
    assert c.at_end("p", 5) == Verdict(process=False, seek_to=1)  # 1..3 had records
