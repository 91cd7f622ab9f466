"""The batch loop: each batch formed at the last moment, run, and observed.

A batch is formed at the last moment (late realtime requests get in and the
deadline predictions stay true): with a hand-over lead, when the running one
is predicted (by the scheduler's latency model) to end within the engine's
measured tokenisation time plus ``scheduler.handover_ms``, so the engine
tokenises the next meanwhile (two in the engine at most); without, or where
the engine gains nothing from it (a CPU), after it ended. The lead learns
(:class:`HandoverLead`): what the device waited for a batch formed at the
hand-over is added to it. What the scheduler
expired is dead-lettered; what it planned goes to compute; each batch's run
time goes back to the scheduler's controller and the metrics.

While the engine holds all the batches it may (one on a CPU), the loop sweeps
(``Scheduler.sweep``): a queued request that could no longer make its deadline
even if the engine were free now is dead-lettered then, when requests arrive
(at most every ``SWEEP_MIN_MS``) and when the sweep said to look again, not
once the running batch ended (issue
31: a burst's batches ran up to 7x their prediction, and requests expired after
them, past their deadline, so their clients heard of it too late to retry).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from pipeline.errors import ExpiredError
from pipeline.inference import InferenceEngine
from pipeline.observability.metrics import PipelineMetrics
from pipeline.scheduling import Plan, Scheduler
from pipeline.scheduling.scheduler import SWEEP_MIN_MS
from pipeline.settings import Settings
from pipeline.worker.answers import Answers
from pipeline.worker.compute import Compute
from pipeline.worker.gates import LaneGates
from pipeline.worker.records import Work

__all__ = ["BatchLoop", "HandoverLead"]


class HandoverLead:
    """How long before the running batch's predicted end the next one is formed: the
    engine's tokenisation time plus ``handover_ms``, plus what the device was measured
    to wait for batches formed at the hand-over.

    A batch handed over in time still reaches the device after it went idle when the
    hand-over takes longer than the engine's tokenisation (the worker's threads wait
    for its interpreter lock, the pipes, the model process's queue) or the running
    batch ends before its prediction. On the simulated slow device with a 3 ms lead
    the device idled a quarter of a saturated phase; with 40 ms, an eighth (F 0.76 ->
    0.99, one run each). So each wait the device reports before a batch formed at the
    hand-over (:attr:`BatchOutcome.idle_before_ms`) is added to the lead, and each
    batch that found it still busy takes back ``DECAY`` of the extra, since a batch
    formed earlier than needed keeps later realtime requests out of it. The extra
    stays within ``MAX_EXTRA_MS``: past it the device waits for something other than
    the hand-over (a host too slow to feed it), which an earlier batch cannot cure.
    """

    MAX_EXTRA_MS = 50.0
    DECAY = 0.03
    #: A wait shorter than this is the clocks' and the pipes' noise, not a late batch.
    NOISE_MS = 0.5

    def __init__(self, handover_ms: float) -> None:
        self.handover_ms = handover_ms
        self.extra_ms = 0.0

    def ms(self, tokenize_ms: float | None) -> float:
        """The lead now, given the engine's measured tokenisation time per batch."""
        return self.handover_ms + (tokenize_ms or 0.0) + self.extra_ms

    def observe(self, idle_before_ms: float) -> None:
        """A batch formed at the hand-over found the device idle this long."""
        if idle_before_ms > self.NOISE_MS:
            self.extra_ms = min(self.extra_ms + idle_before_ms, self.MAX_EXTRA_MS)
        else:
            self.extra_ms *= 1 - self.DECAY


class BatchLoop:
    """Asks the scheduler for batches and runs them (see the module's promise);
    ``wake`` is called when work is queued."""

    def __init__(
        self,
        settings: Settings,
        *,
        engine: InferenceEngine,
        scheduler: Scheduler[Work],
        gates: LaneGates[Work],
        compute: Compute,
        answers: Answers,
        metrics: PipelineMetrics,
        clock_ms: Callable[[], int],
        spawn: Callable[[Awaitable[Any]], asyncio.Task[Any]],
        utilisation: Callable[[], float | None],
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.scheduler = scheduler
        self.gates = gates
        self.compute = compute
        self.answers = answers
        self.metrics = metrics
        self._clock_ms = clock_ms
        self._spawn = spawn
        self._utilisation = utilisation
        self._wake = asyncio.Event()
        self._stirred = asyncio.Event()  # work queued or a batch slot freed: sweep again
        overlap = settings.scheduler.handover_ms >= 0 and engine.overlaps
        self._batch_slots = asyncio.Semaphore(2 if overlap else 1)
        self._inflight_ms: dict[int, float] = {}  # predicted run time per batch in the engine
        self._engine_free_ms = 0.0  # when the engine is predicted to have run them all
        self._batch_done = asyncio.Event()
        self._budget_changes = (0.0, 0.0)
        self.lead = HandoverLead(settings.scheduler.handover_ms)

    def wake(self) -> None:
        """Work was queued: look for a batch now."""
        self._wake.set()
        self._stirred.set()

    async def run(self) -> None:
        """Ask the scheduler for batches forever, each formed at the last moment.

        That moment is when the running batch is predicted (by the latency
        model) to end within the engine's measured tokenisation time plus
        ``scheduler.handover_ms``: the next one is tokenised while it runs.
        """
        while True:
            await self._sweep_until_a_slot_frees()
            await self._batch_slots.acquire()
            await self._until_handover()
            # Formed at the hand-over: the engine was busy and work was waiting. (Had it to
            # wait for work, the device's idle time before it is not the hand-over's.)
            busy = bool(self._inflight_ms)
            plan, waited = await self._next_plan()
            now = self._clock_ms()
            handed_over = busy and not waited
            self._inflight_ms[id(plan)] = plan.predicted_ms
            self._engine_free_ms = max(float(now), self._engine_free_ms) + plan.predicted_ms
            task = self._spawn(self._run_plan(plan, handed_over=handed_over))
            task.add_done_callback(self._slot_freed)

    def _slot_freed(self, _task: asyncio.Task[Any]) -> None:
        self._batch_slots.release()
        self._stirred.set()

    async def _sweep_until_a_slot_frees(self) -> None:
        """While the engine holds all the batches it may, expire what can no longer
        make its deadline: when requests arrive, at most every ``SWEEP_MIN_MS`` (a
        sweep is a whole decision: sweeping on every arrival cost a no-op worker a
        fifth of its rate, three pairs), and when the last sweep said to."""
        swept_at: int | None = None
        wake_at: float | None = None
        while self._batch_slots.locked():
            now = self._clock_ms()
            self._stirred.clear()
            # The time a sweep names is never sooner than SWEEP_MIN_MS after it, so one
            # test covers both: the turn has come, or the time named has.
            if swept_at is None or now - swept_at >= SWEEP_MIN_MS:
                sweep = self.scheduler.sweep(now)
                swept_at, wake_at = now, sweep.next_ms
                if sweep.expired:
                    self.gates.apply()
                    self._expire(sweep.expired, now, "while a batch ran")
            else:  # stirred again soon after a sweep: the next one waits its turn
                wake_at = swept_at + SWEEP_MIN_MS
            wait = None if wake_at is None else max(wake_at - now, 0) / 1000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stirred.wait(), wait)

    async def _until_handover(self) -> None:
        """Wait while batches in the engine are predicted to run longer than the lead."""
        while self._inflight_ms:
            wait_ms = (
                self._engine_free_ms - self.lead.ms(self.engine.tokenize_ms()) - self._clock_ms()
            )
            if wait_ms <= 0:
                return
            self._batch_done.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._batch_done.wait(), wait_ms / 1000)

    def _batch_finished(self, plan: Plan[Work]) -> None:
        # The engine runs batches in order: the next one starts about now.
        self._inflight_ms.pop(id(plan), None)
        self._engine_free_ms = self._clock_ms() + sum(self._inflight_ms.values())
        self._batch_done.set()

    async def _next_plan(self) -> tuple[Plan[Work], bool]:
        """Wait until the scheduler has a batch to run; dead-letter what it expired.
        Returns the plan and whether it had to wait for one."""
        waited = False
        while True:
            now = self._clock_ms()
            self._wake.clear()
            # Batches still in the engine run first: the scheduler counts from their end.
            plan = self.scheduler.next_batch(now, engine_free_ms=self._engine_free_ms)
            if plan is not None:
                self.gates.apply()
                self._expire(plan.expired, now, "as a batch was planned")
                if plan.items:
                    return plan, waited
                continue
            waited = True
            wait = self.scheduler.wait_ms(now, engine_free_ms=self._engine_free_ms)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), None if wait is None else wait / 1000)

    def _expire(self, expired: list[Work], now: int, when: str) -> None:
        """Dead-letter what the scheduler expired, saying when and why."""
        for work in expired:
            req = work.request
            late = now - req.deadline_ms
            trip = work.arrived_ms - req.created_at_ms
            error = ExpiredError(
                f"cannot meet its deadline ({req.lane}; {late:+d} ms past it now, {when}; "
                f"reached the worker {trip} ms after it was made, waited "
                f"{now - work.arrived_ms} ms here)"
            )
            self._spawn(self.answers.dead_letter(work.incoming, error, 1, req.request_id))

    async def _run_plan(self, plan: Plan[Work], *, handed_over: bool = False) -> None:
        batch = plan.items
        start = self._clock_ms()
        try:
            ran = await self.compute.run_batch(batch, shape=(plan.seq_len, plan.batch_shape))
        finally:
            self._batch_finished(plan)
        if handed_over and ran is not None and ran.idle_before_ms is not None:
            self.lead.observe(ran.idle_before_ms)
        latency_ms = ran.ms if ran is not None else float(self._clock_ms() - start)
        self.scheduler.observe(
            plan,
            latency_ms=latency_ms,
            utilisation=self._utilisation(),
            now_ms=self._clock_ms(),
        )
        m = self.metrics
        # Tokens as the model computed them; the scheduler's bucketed plan is in its snapshot.
        real, padded = (ran.real_tokens, ran.padded_tokens) if ran is not None else (0, 0)
        m.batch(len(plan.items), real, padded, latency_ms / 1000, plan.reason)
        snap = self.scheduler.snapshot()
        m.budget(int(snap.get("budget", plan.budget)))
        grows, shrinks = snap.get("budget_grows", 0.0), snap.get("budget_shrinks", 0.0)
        if grows > self._budget_changes[0]:
            m.budget_change("grow")
        if shrinks > self._budget_changes[1]:
            m.budget_change("shrink")
        self._budget_changes = (grows, shrinks)
