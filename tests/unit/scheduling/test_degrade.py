"""The load shedder: escalation order, cooldown, step-by-step recovery, hysteresis."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import ConfigurationError
from pipeline.scheduling.degrade import (
    MAX_LEVEL,
    LoadShedder,
    Shedding,
    ShedTransition,
    shedding_at,
)
from pipeline.settings import LANES, DegradeSettings, Settings

S = DegradeSettings()  # window 10 s, 20 answers, 5 % / 1 %, cooldown 5 s, hold 15 s
STEP_MS = 100  # one realtime answer every 100 ms: 100 answers per window


def feed(
    shedder: LoadShedder, start_ms: int, end_ms: int, late_every: int | None, lane: str = "realtime"
) -> list[ShedTransition]:
    """Answer one request every STEP_MS in [start, end); every ``late_every``-th is late."""
    changes = []
    for n, now in enumerate(range(start_ms, end_ms, STEP_MS)):
        late = late_every is not None and n % late_every == 0
        change = shedder.observe(now, lane, late)
        if change is not None:
            changes.append(change)
    return changes


def test_escalates_in_order_one_level_per_cooldown() -> None:
    shedder = LoadShedder(S)
    changes = feed(shedder, 0, 30_000, late_every=2)  # half of realtime is late
    assert [(c.from_level, c.to_level) for c in changes] == [(0, 1), (1, 2), (2, 3)]
    assert all(c.escalation for c in changes)
    # The first needs min_samples answers; each next one waits out the cooldown.
    assert changes[0].at_ms == (S.min_samples - 1) * STEP_MS
    gaps = [b.at_ms - a.at_ms for a, b in itertools.pairwise(changes)]
    assert gaps == [S.cooldown_ms, S.cooldown_ms]
    assert shedder.level == MAX_LEVEL
    assert shedder.escalations == 3 and shedder.deescalations == 0
    assert shedder.drain() == changes and shedder.drain() == []
    assert shedder.actions == Shedding(
        pause=True,
        expire_early=True,
        deadline_factor=S.standard_deadline_factor,
        max_text_chars=S.max_text_chars,
    )
    assert "escalated 0 -> 1" in str(changes[0])


def test_recovers_to_normal_one_step_per_hold() -> None:
    shedder = LoadShedder(S)
    feed(shedder, 0, 30_000, late_every=2)
    assert shedder.level == 3
    changes = feed(shedder, 30_000, 120_000, late_every=None)
    assert [(c.from_level, c.to_level) for c in changes] == [(3, 2), (2, 1), (1, 0)]
    # Healthy once the last miss (at 29.8 s) has left the window, then hold_ms per step.
    assert changes[0].at_ms == 29_800 + S.window_ms + S.hold_ms
    gaps = [b.at_ms - a.at_ms for a, b in itertools.pairwise(changes)]
    assert gaps == [S.hold_ms, S.hold_ms]
    assert shedder.actions == Shedding()
    assert shedder.deescalations == 3


def test_every_level_has_the_documented_actions() -> None:
    assert shedding_at(0, S) == Shedding()
    assert shedding_at(1, S) == Shedding(pause=True)
    two = shedding_at(2, S)
    assert two.pause and two.expire_early and two.max_text_chars is None
    three = shedding_at(3, S)
    assert three.max_text_chars == S.max_text_chars
    with pytest.raises(ValueError):
        shedding_at(4, S)
    assert three.paused_lanes == {"bulk"} and shedding_at(0, S).paused_lanes == set()
    assert three.expires("standard") and not three.expires("bulk")
    assert not shedding_at(1, S).expires("standard")
    # Standard's budget (deadline - arrival) shrinks by the factor; others keep theirs.
    assert two.deadline_ms("standard", arrived_ms=1000, deadline_ms=3000) == 2000
    assert two.deadline_ms("realtime", arrived_ms=1000, deadline_ms=1200) == 1200
    assert shedding_at(1, S).deadline_ms("standard", arrived_ms=0, deadline_ms=2000) == 2000
    assert three.clip("x" * 600) == "x" * 512 and three.clip("short") == "short"
    assert two.clip("x" * 600) == "x" * 600


def test_steady_borderline_load_never_flaps() -> None:
    # 2 % late, evenly spread: above the healthy ratio, under the escalation
    # ratio in every stretch of answers, whatever its start. Nothing moves.
    shedder = LoadShedder(S)
    assert feed(shedder, 0, 300_000, late_every=50) == []
    # Once escalated by a burst, the same borderline load holds the level too.
    now = 300_000
    while shedder.level == 0:
        shedder.observe(now, "realtime", True)
        now += STEP_MS
    assert feed(shedder, now, now + 300_000, late_every=50) == []
    assert shedder.level == 1


def test_too_few_answers_or_other_lanes_never_escalate() -> None:
    shedder = LoadShedder(S)
    for n in range(S.min_samples - 1):
        assert shedder.observe(n, "realtime", True) is None
    for lane in ("standard", "bulk"):
        assert feed(shedder, 0, 60_000, late_every=1, lane=lane) == []
    assert shedder.level == 0 and shedder.observed == S.min_samples - 1


def test_a_quiet_realtime_lane_lets_the_level_come_down() -> None:
    shedder = LoadShedder(S)
    feed(shedder, 0, 2_000, late_every=1)
    assert shedder.level == 1
    # The caller polls now and then (here every second); health counts from a poll.
    changes = [c for now in range(2_000, 40_000, 1_000) if (c := shedder.poll(now))]
    assert [(c.from_level, c.to_level, c.at_ms) for c in changes] == [(1, 0, 2_000 + S.hold_ms)]


def test_disabled_never_sheds() -> None:
    shedder = LoadShedder(dataclasses.replace(S, enabled=False))
    assert feed(shedder, 0, 60_000, late_every=1) == []
    assert shedder.level == 0 and shedder.snapshot()["level"] == 0.0


def test_settings_section_is_read_and_checked() -> None:
    s = Settings.from_env({"PIPELINE_DEGRADE_HOLD_MS": "100", "PIPELINE_DEGRADE_ENABLED": "no"})
    assert s.degrade.hold_ms == 100 and s.degrade.enabled is False
    with pytest.raises(ConfigurationError, match="miss_ratio_low < miss_ratio_high"):
        Settings.from_env({"PIPELINE_DEGRADE_MISS_RATIO_LOW": "0.2"})
    with pytest.raises(ConfigurationError, match="standard_deadline_factor"):
        DegradeSettings(standard_deadline_factor=0.0)


events = st.lists(
    st.one_of(
        st.tuples(st.integers(0, 2_000), st.sampled_from(LANES), st.booleans()),
        st.tuples(st.integers(0, 20_000), st.none(), st.none()),
    ),
    max_size=300,
)


@settings(max_examples=150, deadline=None)
@given(
    events=events,
    cooldown_ms=st.integers(0, 5_000),
    hold_ms=st.integers(0, 20_000),
    min_samples=st.integers(1, 30),
)
def test_level_stays_in_range_and_moves_one_step_at_a_time(
    events: list[tuple[int, str | None, bool | None]],
    cooldown_ms: int,
    hold_ms: int,
    min_samples: int,
) -> None:
    config = dataclasses.replace(
        S, cooldown_ms=cooldown_ms, hold_ms=hold_ms, min_samples=min_samples, window_ms=3_000
    )
    shedder = LoadShedder(config)
    now, level, last_at = 0, 0, None
    for dt, lane, late in events:
        now += dt
        change = shedder.poll(now) if lane is None else shedder.observe(now, lane, bool(late))
        assert 0 <= shedder.level <= MAX_LEVEL
        assert shedder.actions == shedding_at(shedder.level, config)
        if change is None:
            assert shedder.level == level
            continue
        assert change.from_level == level and abs(change.to_level - level) == 1
        assert change.to_level == shedder.level and change.at_ms == now
        assert last_at is None or now - last_at >= cooldown_ms
        level, last_at = shedder.level, now
    changes = shedder.drain()
    assert shedder.escalations + shedder.deescalations == len(changes)
    assert sum(c.to_level - c.from_level for c in changes) == shedder.level
