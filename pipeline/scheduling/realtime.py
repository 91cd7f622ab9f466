"""Realtime under pressure: the speed its plans allow for, and which of it runs next.

:class:`RealtimePlanner` owns the overrun (how much longer than predicted the
last batches ran) and makes the two realtime-specific choices of a decision
(:class:`~pipeline.scheduling.scheduler.Scheduler` asks it, pure, no clock):

- :meth:`RealtimePlanner.cut`: the budget cut so that the batch to run now is
  predicted (times the overrun) to end before the tightest realtime deadline,
  as long as that request still fits;
- :meth:`RealtimePlanner.triage`: when more realtime is pending than one such
  batch holds, the layout (:mod:`.triage`) of all of it into the batches that
  would run it, what no batch of it finishes in time (to expire now), and the
  batch to run now (the layout's first).

Realtime's plans multiply the latency model's predictions by the overrun the
last ``OVERRUN_BATCHES`` batches measured (run time over prediction, or the
newest batch's if more; 1 to ``MAX_OVERRUN``): in a burst on 2 shared cores,
batches ran 1.5-7x their prediction, and a realtime batch planned to the edge
of its deadline then finished every one of its requests late. The overrun
sizes batches and rejects nothing: a request is hopeless only when the model's
own prediction leaves it no chance.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from pipeline.scheduling.budget import Shapes
from pipeline.scheduling.controller import Controller
from pipeline.scheduling.lanes import Entry, Queued
from pipeline.scheduling.triage import Triage, triage
from pipeline.settings import SchedulerSettings

__all__ = ["MAX_OVERRUN", "OVERRUN_BATCHES", "RealtimePlanner"]

#: Realtime's plans allow for the last this many batches' measured run time over
#: their prediction, taken as at least 1 and at most ``MAX_OVERRUN``.
OVERRUN_BATCHES = 4
MAX_OVERRUN = 3.0

T = TypeVar("T", bound=Queued)

#: What :meth:`RealtimePlanner.triage` decides: the requests to expire now, the budget
#: of the batch to run now, the realtime requests it is to hold (``None``: as the
#: assembly picks), and the layout (``None``: no triage).
Choice = tuple[list[Entry[T]], int, list[Entry[T]] | None, Triage[T] | None]


class RealtimePlanner(Generic[T]):
    """The overrun and realtime's part of each decision (see the module's promise).
    ``on``: whether realtime's hopeless requests expire and the triage is on."""

    def __init__(
        self, settings: SchedulerSettings, controller: Controller, shapes: Shapes, *, on: bool
    ) -> None:
        self.settings = settings
        self.controller = controller
        self.shapes = shapes
        self.on = on
        self._ran: deque[tuple[float, float]] = deque(maxlen=OVERRUN_BATCHES)  # (predicted, ran)
        #: How much longer than predicted the last batches ran (their measured run time
        #: over their prediction, summed, or the newest batch's if more), within
        #: 1..``MAX_OVERRUN``: realtime's plans multiply the model's predictions by it.
        self.overrun = 1.0

    def observe(self, predicted_ms: float, ran_ms: float) -> None:
        """Fold one finished batch's prediction and measured run time into the overrun."""
        if predicted_ms <= 0:
            return
        self._ran.append((predicted_ms, ran_ms))
        ran = sum(r for _, r in self._ran) / sum(p for p, _ in self._ran)
        # The newest batch alone when it ran slower: contention starts with a burst,
        # and the batches before it, run at leisure, would dilute it.
        self.overrun = min(max(ran, ran_ms / predicted_ms, 1.0), MAX_OVERRUN)

    def planned_ms(self, padded_tokens: int) -> float:
        """A realtime batch's run time as planned: the latency model's prediction times
        the overrun the last batches measured."""
        return self.controller.predict_ms(padded_tokens) * self.overrun

    def cut(self, budget: int, urgent: Entry[T], start_ms: float) -> int:
        """``budget`` cut so that a batch from ``start_ms`` is predicted, as planned, to
        end before the deadline of ``urgent`` (the most urgent realtime request), as
        long as it still fits (if it does not, it is hopeless and expires instead).

        The cut holds when not every pending realtime request fits in it: those ride
        in the next batches with their own, later deadlines. Keeping the full budget
        then would predict the batch past every deadline in a burst (all requests made
        at once have about the same headroom) and expire them all."""
        controller = self.controller
        headroom = urgent.deadline_ms - start_ms - self.settings.margin_ms
        seq = self.shapes.seq_len(urgent.bucket)
        if controller.tokens_within(headroom) < seq:  # it cannot make it, as predicted
            return budget
        return min(budget, max(controller.tokens_within(headroom / self.overrun), seq))

    def triage(
        self, realtime: list[Entry[T]], start_ms: float, budget: int, *, aged_ms: float
    ) -> Choice[T]:
        """The realtime requests that cannot make their deadline in any batch (to expire
        now), the budget of the batch to run now, and the realtime requests it is to
        hold: the first batch of the layout when it spans several (``None`` when one
        batch holds all: as usual). ``aged_ms``: when the first request of a lower
        lane becomes overdue."""
        if not realtime or not self.on:
            return [], budget, None, None
        s = self.settings
        lay: Callable[..., Triage[T]] = functools.partial(
            triage, realtime, self.shapes, start_ms=start_ms,
            predict_ms=self.planned_ms, max_items=s.max_items, margin_ms=s.margin_ms,
            alone_ms=self.controller.predict_ms,  # rejected only when hopeless as predicted
        )  # fmt: skip
        capped = lay(max_tokens=budget)
        if not capped.batches or (len(capped.batches) == 1 and not capped.hopeless):
            # All hopeless, or one capped batch holds all.
            return capped.hopeless, budget, None, capped
        # More realtime than one capped batch holds: batches as large as the deadlines
        # allow (the controller's budget still bounds them) may finish more of it, or
        # as many sooner, with room to spare for a slower batch than predicted. Bounded
        # by token_budget_max instead, in three isolated pairs on the loaded machine, a
        # burst of 1,000 had 0-3 of its realtime on time and 0-9 late against 0-23 and
        # 0-1 (docs/design.md, "Realtime beyond capacity").
        full = lay(max_tokens=max(budget, self.controller.budget))
        # Only while it ends before a request of a lower lane becomes overdue: aging's
        # bound counts on the batch running then being no longer than a capped one.
        ends = start_ms + self.planned_ms(full.padded[0]) + s.margin_ms
        better = (full.on_time, -full.end_ms) > (capped.on_time, -capped.end_ms)
        if better and ends <= aged_ms:
            return full.hopeless, full.padded[0], full.batches[0], full
        # The layout's first batch, not the assembly's own pick from the head: in a
        # burst of 300 the head's earliest deadline was a 42-token text, and a batch of
        # two padded to it ran where the layout had ten short ones (replayed at a CPU's
        # cost: 16 of 19 realtime on time, 19 of 19 with the layout's batch).
        return capped.hopeless, budget, capped.batches[0], capped

    def can_wait(
        self, realtime: list[Entry[T]], layout: Triage[T], until_ms: float, budget: int,
        *, aged_ms: float,
    ) -> bool:  # fmt: skip
        """Whether the batch to run now may wait until ``until_ms`` at no cost to the
        realtime queued: a layout of it starting a hold (``wake_hold_ms``) later still
        finishes as many in time, as planned, as ``layout``, the one from now, and
        finds none more hopeless (the hold's time to spare for a batch slower than
        planned; and what is rejected is rejected at once, not after the hold)."""
        spare = until_ms + self.settings.wake_hold_ms
        later = self.triage(realtime, spare, budget, aged_ms=aged_ms)[3]
        return (
            later is not None
            and len(later.hopeless) <= len(layout.hopeless)
            and self._in_time(later) >= self._in_time(layout)
        )

    def _in_time(self, layout: Triage[T]) -> int:
        """The requests of ``layout`` whose batch ends, as planned, by their deadlines (a
        layout also keeps a request that only the model's own prediction finishes)."""
        return sum(
            len(batch)
            for start, padded, batch in zip(
                layout.starts, layout.padded, layout.batches, strict=True
            )
            if start + self.planned_ms(padded) <= min(e.deadline_ms for e in batch)
        )
