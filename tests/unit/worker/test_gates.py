"""Lane gates (``pipeline.worker.gates``): pauses from full queues and load shedding,
work parked while its lane's queue is full, and who is told when a lane opens.

The scheduler is the real one with small queues; the shedding policy is a set.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import pytest
from support.scheduling import Item

from pipeline.observability.metrics import PipelineMetrics
from pipeline.scheduling import Controller, Scheduler
from pipeline.settings import SchedulerSettings
from pipeline.worker.gates import LaneGates


def _gates(
    queue_size: int = 2, clock: Callable[[], float] = time.monotonic
) -> tuple[LaneGates[Item], set[str], list[str]]:
    settings = dataclasses.replace(SchedulerSettings(), queue_size=queue_size)
    scheduler: Scheduler[Item] = Scheduler(
        settings, expires=lambda lane: False, controller=Controller(settings, slo_ms=200)
    )
    shed: set[str] = set()
    woken: list[str] = []
    gates = LaneGates(
        scheduler,
        PipelineMetrics(process_collectors=False),
        shed_lanes=lambda: shed,
        on_room=lambda: woken.append("room"),
        clock=clock,
    )
    return gates, shed, woken


def _item(name: str, lane: str, deadline_ms: int = 1000) -> Item:
    return Item(name, lane, deadline_ms, 0, 8)


def test_a_full_queue_parks_work_closes_its_lane_and_reopens_it_in_order() -> None:
    gates, _shed, woken = _gates(queue_size=2)
    for name in ("b0", "b1", "b2", "b3"):
        gates.offer(_item(name, "bulk"))
    assert not gates.open("bulk")  # paused at its bound, with two parked
    assert gates.open("realtime") and gates.open("standard")
    queues = gates.scheduler.queues
    assert [e.item.payload for e in queues.entries("bulk")] == ["b0", "b1"]
    queues.remove(list(queues.entries("bulk")))  # a batch took them
    gates.apply()
    assert [e.item.payload for e in queues.entries("bulk")] == ["b2", "b3"]  # oldest first
    assert woken, "the reader was not told that bulk has room"


def test_load_shedding_pauses_a_lane_and_resuming_wakes_the_reader() -> None:
    gates, shed, woken = _gates()
    shed.add("bulk")
    gates.apply()
    assert not gates.open("bulk") and gates.open("standard")
    assert woken == []
    shed.clear()
    gates.apply()
    assert gates.open("bulk")
    assert woken == ["room"]


def test_giving_up_takes_the_parked_work_out() -> None:
    gates, _shed, _woken = _gates(queue_size=1)
    for name in ("s0", "s1", "s2"):
        gates.offer(_item(name, "standard"))
    assert [it.payload for it in gates.give_up()] == ["s1", "s2"]
    assert gates.give_up() == []


def test_pauses_at_the_bound_log_the_first_then_one_line_per_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Under a backlog a lane pauses at its bound and resumes every few ms: the first of
    each is logged, then one line per FLOW_LOG_S (10 s) says how many there were."""
    now = [0.0]
    gates, _shed, _woken = _gates(queue_size=2, clock=lambda: now[0])
    queues = gates.scheduler.queues

    def cycle(at: float) -> None:
        now[0] = at
        for name in ("a", "b", "c"):
            gates.offer(_item(name, "bulk"))
        assert not gates.open("bulk")
        queues.remove(list(queues.entries("bulk")))
        gates.apply()
        queues.remove(list(queues.entries("bulk")))
        gates.apply()
        assert gates.open("bulk")

    with caplog.at_level(logging.INFO, logger="pipeline.worker.gates"):
        for at in (0.0, 1.0, 2.0, 3.0, 4.0):
            cycle(at)
        assert caplog.messages == [
            "lane bulk paused: queue at its bound (2 queued)",
            "lane bulk resumed",
        ]
        caplog.clear()
        cycle(10.5)
    assert caplog.messages == [
        "lane bulk paused: queue at its bound (2 queued) (5 times since the last such line)",
        "lane bulk resumed (5 times since the last such line)",
    ]


def test_a_pause_by_load_shedding_and_its_resume_are_always_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A lane's resumes at its queue's bound are counted per window; the resume that ends
    a pause by load shedding is not folded into that count (nor its pause)."""
    now = [0.0]
    gates, shed, _woken = _gates(queue_size=2, clock=lambda: now[0])
    queues = gates.scheduler.queues
    with caplog.at_level(logging.INFO, logger="pipeline.worker.gates"):
        for name in ("a", "b", "c"):
            gates.offer(_item(name, "bulk"))
        queues.remove(list(queues.entries("bulk")))
        gates.apply()
        queues.remove(list(queues.entries("bulk")))
        gates.apply()  # paused at the bound, resumed: both logged, the first of the window
        now[0] = 1.0
        shed.add("bulk")
        gates.apply()
        now[0] = 2.0
        shed.clear()
        gates.apply()
    assert caplog.messages == [
        "lane bulk paused: queue at its bound (2 queued)",
        "lane bulk resumed",
        "lane bulk paused: load shedding (0 queued)",
        "lane bulk resumed: load shedding over",
    ]
