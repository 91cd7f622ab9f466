"""The per-partition watermark never releases past a pending offset (faust #606)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.worker.acks import OffsetWatermark


def test_out_of_order_completion_releases_a_contiguous_prefix() -> None:
    wm: OffsetWatermark[str] = OffsetWatermark()
    for offset in (10, 11, 12):
        wm.track("p0", offset, f"e{offset}")
    assert wm.done("p0", 12) == []
    assert wm.done("p0", 11) == []
    assert wm.pending("p0") == 3  # 10 holds the other two back
    assert wm.done("p0", 10) == ["e10", "e11", "e12"]
    assert wm.pending() == 0


def test_partitions_are_independent_and_forget_drops_pending() -> None:
    wm: OffsetWatermark[int] = OffsetWatermark()
    wm.track("a", 1, 1)
    wm.track("b", 1, 2)
    assert wm.done("b", 1) == [2]
    assert wm.forget("a") == 1
    assert wm.done("a", 1) == []


def test_offsets_must_increase() -> None:
    wm: OffsetWatermark[int] = OffsetWatermark()
    wm.track("a", 5, 5)
    with pytest.raises(ValueError, match="arrived after"):
        wm.track("a", 5, 5)


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=60, unique=True), st.randoms())
def test_any_completion_order_releases_each_once_in_order(
    offsets: list[int], rng: random.Random
) -> None:
    offsets.sort()
    wm: OffsetWatermark[int] = OffsetWatermark()
    for o in offsets:
        wm.track("p", o, o)
    order = offsets[:]
    rng.shuffle(order)
    released: list[int] = []
    finished: set[int] = set()
    for o in order:
        finished.add(o)
        out = wm.done("p", o)
        released.extend(out)
        # never released beyond the first unfinished offset
        unfinished = [x for x in offsets if x not in finished]
        if unfinished:
            assert all(r < unfinished[0] for r in released)
    assert released == offsets
