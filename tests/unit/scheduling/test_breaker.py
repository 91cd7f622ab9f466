"""The model's circuit breaker: open, reject, probe, close or re-open with a longer wait."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import CircuitOpenError, ConfigurationError, InferenceError
from pipeline.scheduling.breaker import BreakerTransition, CircuitBreaker, State
from pipeline.settings import BreakerSettings, Settings

S = BreakerSettings()  # 5 failures, open 5 s, at most 60 s


def state_of(breaker: CircuitBreaker) -> State:
    """The state now (read through a call, so mypy does not keep an earlier narrowing)."""
    return breaker.state


def tripped(now_ms: int = 0) -> CircuitBreaker:
    breaker = CircuitBreaker(S)
    for _ in range(S.failures_to_open):
        breaker.record(now_ms, ok=False)
    assert breaker.state is State.OPEN
    breaker.drain()
    return breaker


def test_opens_after_consecutive_failures_only() -> None:
    breaker = CircuitBreaker(S)
    for n in range(20):  # a success now and then resets the streak
        assert breaker.record(n, ok=n % S.failures_to_open != 0) is None
    assert breaker.state is State.CLOSED
    for _ in range(S.failures_to_open - 1):
        assert breaker.record(100, ok=False) is None
    change = breaker.record(100, ok=False)
    assert change == BreakerTransition(
        State.CLOSED, State.OPEN, "5 consecutive failed model calls", 100, S.open_ms
    )
    assert str(change) == (
        "model circuit closed -> open: 5 consecutive failed model calls (open for 5000 ms)"
    )
    assert breaker.drain() == [change]
    assert breaker.counts["opened"] == 1


def test_rejects_while_open_then_lets_one_probe_through() -> None:
    breaker = tripped(now_ms=1_000)
    assert not breaker.allow(1_000)
    assert not breaker.allow(1_000 + S.open_ms - 1)
    assert breaker.counts["rejected"] == 2 and breaker.state is State.OPEN
    assert breaker.allow(1_000 + S.open_ms)  # the probe
    assert state_of(breaker) is State.HALF_OPEN
    [change] = breaker.drain()
    assert (change.from_state, change.to_state) == (State.OPEN, State.HALF_OPEN)
    assert not breaker.allow(1_000 + S.open_ms + 1)  # one probe at a time
    assert breaker.counts["probes"] == 1


def test_a_successful_probe_closes_it() -> None:
    breaker = tripped()
    assert breaker.allow(S.open_ms)
    change = breaker.record(S.open_ms + 40, ok=True)
    assert change is not None and change.to_state is State.CLOSED
    assert breaker.allow(S.open_ms + 41) and breaker.open_ms == S.open_ms
    assert breaker.counts["closed"] == 1


def test_failed_probes_reopen_it_with_a_growing_capped_wait() -> None:
    breaker = tripped()
    now, waits = S.open_ms, []  # each probe is due open_ms after the last opening
    for _ in range(6):
        assert breaker.allow(now)
        change = breaker.record(now + 10, ok=False)
        assert change is not None and change.to_state is State.OPEN
        assert change.reason == "probe call failed"
        waits.append(change.open_ms)
        assert not breaker.allow(now + 10 + change.open_ms - 1)
        now += 10 + change.open_ms
    assert waits == [10_000, 20_000, 40_000, 60_000, 60_000, 60_000]
    # Success resets the wait; the next opening starts from open_ms again.
    assert breaker.allow(now) and breaker.record(now, ok=True) is not None
    for _ in range(S.failures_to_open):
        change = breaker.record(now, ok=False)
    assert change is not None and change.open_ms == S.open_ms


def test_stale_outcomes_and_lost_probes() -> None:
    breaker = tripped()
    # A call started before the breaker opened reports late: ignored.
    assert breaker.record(10, ok=True) is None and breaker.state is State.OPEN
    assert breaker.poll(S.open_ms) is not None and state_of(breaker) is State.HALF_OPEN
    assert breaker.record(S.open_ms, ok=True) is None  # no probe was let through yet
    assert breaker.allow(S.open_ms)
    # The probe's outcome never comes: after another open_ms a new probe goes.
    assert not breaker.allow(2 * S.open_ms - 1)
    assert breaker.allow(2 * S.open_ms) and breaker.counts["probes"] == 2


def test_disabled_always_allows() -> None:
    breaker = CircuitBreaker(dataclasses.replace(S, enabled=False))
    for n in range(50):
        assert breaker.record(n, ok=False) is None
    assert breaker.allow(50) and breaker.state is State.CLOSED
    assert breaker.snapshot()["failures"] == 50.0


def test_error_and_settings() -> None:
    error = CircuitOpenError("model circuit open")
    assert isinstance(error, InferenceError) and error.stage == "infer"
    s = Settings.from_env({"PIPELINE_BREAKER_OPEN_MS": "100", "PIPELINE_BREAKER_ENABLED": "0"})
    assert s.breaker.open_ms == 100 and not s.breaker.enabled
    assert s.breaker.fallback_model_path == ""
    with pytest.raises(ConfigurationError, match="open_ms <= open_ms_max"):
        Settings.from_env({"PIPELINE_BREAKER_OPEN_MS": "90000"})
    with pytest.raises(ConfigurationError, match="FAILURES_TO_OPEN"):
        BreakerSettings(failures_to_open=0)


EDGES = {
    (State.CLOSED, State.OPEN),
    (State.OPEN, State.HALF_OPEN),
    (State.HALF_OPEN, State.CLOSED),
    (State.HALF_OPEN, State.OPEN),
}


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(0, 30_000), st.sampled_from(["allow", "ok", "fail", "poll"])),
        max_size=200,
    ),
    failures_to_open=st.integers(1, 6),
)
def test_only_documented_transitions_happen(
    steps: list[tuple[int, str]], failures_to_open: int
) -> None:
    config = dataclasses.replace(S, failures_to_open=failures_to_open)
    breaker = CircuitBreaker(config)
    now, state = 0, State.CLOSED
    for dt, action in steps:
        now += dt
        if action == "allow":
            allowed = breaker.allow(now)
            assert allowed or breaker.state is not State.CLOSED
        elif action == "poll":
            breaker.poll(now)
        else:
            breaker.record(now, ok=action == "ok")
        for change in breaker.drain():
            assert change.from_state is state and (state, change.to_state) in EDGES
            assert change.at_ms == now
            state = change.to_state
        assert breaker.state is state
        assert S.open_ms <= breaker.open_ms <= S.open_ms_max
    c = breaker.counts
    assert c["opened"] >= c["half_opened"] >= c["closed"]
