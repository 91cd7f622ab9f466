"""The micro-batch scheduler: when to run which requests, driven by an injected clock.

The caller owns time (integer milliseconds), the model and the topics; the
scheduler only decides. The loop it expects::

    scheduler.offer(item)              # False: lane full, pause its topic, retry later
    wait = scheduler.wait_ms(now)      # None: empty; else sleep at most this long
    plan = scheduler.next_batch(now)   # None: nothing due yet
    ...dead-letter plan.expired, run plan.items, measure...
    scheduler.observe(plan, latency_ms=..., utilisation=..., now_ms=...)
    sweep = scheduler.sweep(now)       # while the engine is busy: dead-letter
                                       # sweep.expired, look again at sweep.next_ms

Call ``wait_ms`` again after every ``offer``: a new request can move the
next dispatch earlier. ``wait_ms(now) == 0`` exactly when ``next_batch(now)``
returns a plan.

A batch is dispatched when it is full (budget or ``max_items`` reached),
when a pending deadline cannot wait longer (deadline - predicted run time -
margin), when a request of a lower lane has waited its lane's max wait
(aging, so bulk never starves), or when the batch's oldest request has
waited ``window_ms``. Before that, a request of a lane that ``expires`` that cannot
meet its deadline in the batch that would run now (by the controller's
latency model) is taken out and reported in ``Plan.expired``: it never
reaches the model. Requests of other lanes run late. While realtime work is
pending, the budget shrinks so that the batch is predicted to end before the
tightest realtime deadline, as long as that request still fits; the realtime
requests left out ride in the next batches.

When more realtime work is pending than one such batch holds, the realtime
requests are laid out into the batches that would run them (:mod:`.realtime`,
:mod:`.triage`): a request no batch of that layout finishes in time is
expired now, well before its deadline, and the batch to run now holds the
realtime requests of the layout's first batch. ``triage`` off keeps the
capped batches. Predictions count from ``engine_free_ms`` when the caller
passes it: a batch planned while others are still in the engine starts after
them. Realtime's plans (the layout and the cut) allow for the overrun the
last batches measured (:mod:`.realtime`).

No batch is planned past the controller's latency threshold, and while
realtime flows (a realtime request arrived within ``FLOW_MS``) past
``flow_threshold`` of the realtime deadline: a realtime request waits for the
batch running when it arrives, then runs in a batch of its own, so the two
bound its time in the worker (docs/design.md, "Realtime beside bulk"). The
same bound holds for a realtime deadline after a request reaches an empty
scheduler: a burst's realtime may arrive right behind its first requests.

A request judged hopeless is expired by the next decision, and while the
engine is busy by :meth:`Scheduler.sweep`, which the caller runs when requests
arrive (at most every ``SWEEP_MIN_MS``) and at the time the last sweep named:
it expires what the next plan would expire were the engine free now, so a
client hears of it before its deadline (Triton's REJECT) rather than once the
running batch ends. After a wake, a batch that filled up (a burst, not a lone
request) waits until ``wake_hold_ms`` after the wake, so that a burst's
realtime, fetched behind its first requests, runs first and is laid out with
all of it; with realtime in the batch, only while waiting costs none of it.

A decision looks at the first ``LOOKAHEAD_BATCHES * max_items`` requests of
each lane in deadline order, not at whole queues (scanning hundreds for every
batch cost a no-op worker a sixth of its time). What it passes over has a
later deadline than what it looks at; the expiry sweep repeats until the head
holds no hopeless request, so expiry stays exact, and aging is judged on the
head (a request deep in a lane was, by its later deadline, made later, unless
requests with shorter deadlines of their own came after it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from pipeline.scheduling.budget import DUE, LATE, Draft, Plan, Shapes, assemble
from pipeline.scheduling.controller import Controller
from pipeline.scheduling.lanes import Entry, LaneQueues, Queued
from pipeline.scheduling.realtime import RealtimePlanner
from pipeline.scheduling.stats import SchedulerStats
from pipeline.scheduling.triage import Triage
from pipeline.settings import LANES, SchedulerSettings

__all__ = ["Scheduler", "Sweep"]

#: Batches' worth of requests per lane a decision looks at.
LOOKAHEAD_BATCHES = 4

#: Realtime flows while its last request arrived at most this long ago (ms).
FLOW_MS = 1000

#: Sweeps (:meth:`Scheduler.sweep`) are at least this far apart: the time a sweep names
#: for the next is never sooner, and the caller sweeps for arrivals no oftener.
SWEEP_MIN_MS = 5

T = TypeVar("T", bound=Queued)


@dataclass
class _Decision(Generic[T]):
    draft: Draft[T]
    hopeless: list[Entry[T]]  # expiring requests that cannot make their deadline
    due_ms: float  # when the draft should run; <= now means now
    reason: str
    #: How much later the decision's start may move before a kept request of an
    #: expiring lane turns hopeless (as the rules judged it; ``inf``: none can).
    slack_ms: float = math.inf


@dataclass
class Sweep(Generic[T]):
    """What :meth:`Scheduler.sweep` expired, and when to sweep again."""

    expired: list[T]
    #: When a queued request may next turn hopeless, should nothing else change (new
    #: requests can move it earlier: sweep again after an ``offer``); ``None``: no
    #: queued request can (none of a lane that expires).
    next_ms: float | None


class Scheduler(Generic[T]):
    """Priority lanes, deadlines, token budget and length buckets (see the module's promise)."""

    def __init__(
        self,
        settings: SchedulerSettings,
        *,
        expires: Callable[[str], bool],
        controller: Controller,
        lanes: Iterable[str] = LANES,
        accelerated: bool = False,
    ) -> None:
        settings = settings.for_device(accelerated)  # max_items 0: auto
        self.settings = settings
        self.controller = controller
        #: Whether a lane's hopeless requests expire (``Deadlines.expires``).
        self.expires = expires
        self.shapes = Shapes(settings.buckets, settings.max_items)
        self.queues: LaneQueues[T] = LaneQueues(
            lanes,
            queue_size=settings.queue_size,
            resume_fraction=settings.resume_fraction,
            lookahead=LOOKAHEAD_BATCHES * settings.max_items,
        )
        self.lanes = self.queues.lanes
        self._rank = {lane: i for i, lane in enumerate(self.lanes)}
        #: What it decided, counted (:meth:`snapshot` flattens it).
        self.stats: SchedulerStats[T] = SchedulerStats(self.lanes)
        self.last_latency_ms = 0.0
        self.realtime_seen_ms = -math.inf  # arrival of the latest realtime request
        self.woke_ms = -math.inf  # the latest arrival into an empty scheduler
        #: The overrun, the realtime cut and the triage (:mod:`.realtime`).
        self.realtime: RealtimePlanner[T] = RealtimePlanner(
            settings, controller, self.shapes,
            on=expires(self.lanes[0]) and settings.triage == "on",
        )  # fmt: skip

    @property
    def overrun(self) -> float:
        """How much longer than predicted the last batches ran (:mod:`.realtime`)."""
        return self.realtime.overrun

    # -- queues and backpressure ---------------------------------------------

    def offer(self, item: T) -> bool:
        """Queue ``item``; ``False`` (not queued) when its lane's queue is full."""
        if item.lane == self.lanes[0]:
            self.realtime_seen_ms = max(self.realtime_seen_ms, item.arrived_ms)
        if not len(self.queues):
            self.woke_ms = max(self.woke_ms, item.arrived_ms)
        return self.queues.offer(item, self.shapes.seq_index(item.tokens))

    def depth(self, lane: str) -> int:
        return self.queues.depth(lane)

    def full(self, lane: str) -> bool:
        return self.queues.full(lane)

    def __len__(self) -> int:
        return len(self.queues)

    def lanes_to_pause(self) -> list[str]:
        """Lanes whose topics to pause now, lowest first (realtime last); each once."""
        return self.queues.lanes_to_pause()

    def lanes_to_resume(self) -> list[str]:
        """Paused lanes whose topics to resume now, highest first; each once."""
        return self.queues.lanes_to_resume()

    # -- decisions -------------------------------------------------------------

    def wait_ms(self, now_ms: int, *, engine_free_ms: float | None = None) -> int | None:
        """How long the caller may sleep before ``next_batch``; ``None`` when empty.
        ``engine_free_ms``: when the batches already in the engine are predicted to
        end (the next one starts then, not now); ``None``: the engine is idle."""
        if not len(self.queues):
            return None
        decision = self._decide(now_ms, engine_free_ms)
        if decision.hopeless:
            return 0
        return max(0, math.ceil(decision.due_ms - now_ms))

    def next_batch(self, now_ms: int, *, engine_free_ms: float | None = None) -> Plan[T] | None:
        """The batch to run now, with any expired requests; ``None`` when nothing is due.
        ``engine_free_ms`` as for :meth:`wait_ms` (pass the same to both)."""
        expired, decision = self._take_hopeless(now_ms, engine_free_ms)
        if decision is None or decision.due_ms > now_ms:
            if not expired:
                return None
            self.stats.reasons["expired"] += 1
            return Plan([], expired, 0, 0, 0, 0, self.controller.budget, "expired")
        draft = decision.draft
        self.queues.remove(draft.entries)
        entries = sorted(
            draft.entries, key=lambda e: (self._rank[e.item.lane], e.deadline_ms, e.seq)
        )
        plan = Plan(
            items=[e.item for e in entries],
            expired=expired,
            seq_len=draft.seq_len,
            batch_shape=self.shapes.batch_shape(len(entries)),
            real_tokens=draft.real,
            padded_tokens=draft.padded,
            budget=draft.budget,
            reason=decision.reason,
            predicted_ms=self.controller.predict_ms(draft.padded),
        )
        self.stats.planned(plan, now_ms)
        return plan

    def sweep(self, now_ms: int) -> Sweep[T]:
        """While the engine is busy: take out the queued requests of expiring lanes that
        could no longer make their deadline even if the engine were free now, by the
        rules :meth:`next_batch` expires by (the triage's layout from ``now_ms``, the
        batch that would run now, the latency model's own prediction), so that their
        clients hear of it before their deadline rather than once the running batch
        ends. Everything it expires, ``next_batch`` at ``now_ms`` with the engine free
        would have expired too; it plans nothing."""
        if not any(self.expires(lane) and self.queues.depth(lane) for lane in self.lanes):
            return Sweep([], None)  # nothing queued can expire: no decision to make
        expired, decision = self._take_hopeless(now_ms, None)
        self.stats.swept += len(expired)
        if decision is None or math.isinf(decision.slack_ms):
            return Sweep(expired, None)
        return Sweep(expired, now_ms + max(decision.slack_ms, SWEEP_MIN_MS))

    def _take_hopeless(
        self, now_ms: int, engine_free_ms: float | None
    ) -> tuple[list[T], _Decision[T] | None]:
        """Take out (and count) what cannot make its deadline, deciding again until a
        decision finds nothing hopeless; that decision (None: the queues emptied)."""
        expired: list[T] = []
        decision = None
        while len(self.queues):
            decision = self._decide(now_ms, engine_free_ms)
            if not decision.hopeless:
                break
            self.queues.remove(decision.hopeless)
            expired += (e.item for e in decision.hopeless)
            decision = None
        self.stats.expire(expired)
        return expired, decision

    def observe(
        self, batch: Plan[T], *, latency_ms: float, utilisation: float | None, now_ms: int
    ) -> None:
        """Feed one finished batch's measured run time and device utilisation (0..1)
        to the controller; ``now_ms`` is when it finished."""
        del now_ms  # the controller counts batches, not time
        if not batch.items:
            return
        self.last_latency_ms = latency_ms
        self.realtime.observe(batch.predicted_ms, latency_ms)
        saturated = (
            batch.padded_tokens + batch.seq_len > batch.budget
            and batch.budget >= self.controller.budget
        )
        self.controller.observe(
            padded_tokens=batch.padded_tokens,
            latency_ms=latency_ms,
            utilisation=utilisation,
            saturated=saturated,
        )

    def snapshot(self) -> dict[str, float]:
        """Every counter and gauge as a flat ``name -> value`` map (controller's included)."""
        return self.stats.snapshot(self.queues) | self.controller.snapshot()

    # -- internals ---------------------------------------------------------------

    def _budget_now(self, now_ms: int, start_ms: float, *, due_waiting: bool) -> int:
        """The controller's budget within the latency bound, cut for the most urgent
        realtime request (:meth:`RealtimePlanner.cut`) unless a request of a lower
        lane is due (aging's bound wins over the cut)."""
        controller = self.controller
        # No batch is planned to run past the controller's latency threshold (the
        # flow threshold while realtime flows), even before three slow batches have
        # shrunk the budget: a realtime request that arrives now waits for the
        # running batch, and then runs in the next one.
        limit_ms = controller.threshold_ms
        if (
            now_ms - self.realtime_seen_ms <= FLOW_MS
            or now_ms - self.woke_ms <= controller.slo_ms  # a burst's realtime may follow
        ):
            limit_ms = min(limit_ms, self.settings.flow_threshold * controller.slo_ms)
        cap = max(controller.tokens_within(limit_ms), self.settings.token_budget_min)
        budget = min(controller.budget, cap)
        realtime = self.queues.entries(self.lanes[0])
        if realtime and not due_waiting:
            budget = self.realtime.cut(budget, realtime[0], start_ms)  # EDF order: the most urgent
        return budget

    def _hold_until(
        self, now_ms: int, draft: Draft[T], realtime: list[Entry[T]], *, start: float,
        cut: int, layout: Triage[T] | None, aged_ms: float,
    ) -> float:  # fmt: skip
        """Until when ``draft`` waits after a wake (``-inf``: no hold); ``realtime`` is the
        realtime head the decision looked at. Just after a wake a burst's realtime may
        still be on its way: a batch that filled up (a burst, not a lone request) waits
        out the hold, so that realtime arriving meanwhile runs first, or is laid out
        with the realtime already here; with realtime in it, only while that costs none
        of the realtime queued (:meth:`RealtimePlanner.can_wait`). Deadlines and aging
        still dispatch it."""
        until = self.woke_ms + self.settings.wake_hold_ms
        if not draft.full or until <= now_ms:
            return -math.inf
        top = self.lanes[0]
        if all(e.item.lane != top for e in draft.entries):
            return until
        if layout is not None and self.realtime.can_wait(
            realtime, layout, max(start, until), cut, aged_ms=aged_ms
        ):
            return until
        return -math.inf

    def _decide(self, now_ms: int, engine_free_ms: float | None = None) -> _Decision[T]:
        s = self.settings
        # The batch planned now starts once those in the engine end: its predictions
        # count from then.
        start = float(now_ms) if engine_free_ms is None else max(float(now_ms), engine_free_ms)
        # Triggers look one full batch ahead (not a shrunk one): aged and urgent
        # requests that collide then still make it within a batch or two.
        lead = self.controller.predict_ms(self.controller.budget) + s.margin_ms
        heads = {lane: self.queues.head(lane) for lane in self.lanes}
        # Judged once per decision (the budget and the assembly both need it), in one
        # pass per lane: with hundreds of requests looked at, a call per request
        # cost a no-op worker a tenth of its time. A request of a lower lane is
        # overdue once its bound (aging's, or its deadline if sooner) is within
        # ``lead``: DUE while still within it, LATE past it.
        urgency: dict[int, int] = {}
        aged = math.inf  # the earliest moment a request ages, less the lead
        for i, lane in enumerate(self.lanes):
            head = heads[lane]
            wait = s.max_wait_ms(lane)
            if i == 0:
                if head and wait is not None:
                    aged = min(aged, min(e.item.arrived_ms for e in head) + wait - lead)
                continue
            for e in head:
                bound = e.deadline_ms
                if wait is not None:
                    aged_ms = e.item.arrived_ms + wait
                    # Comparisons, not min(): a call per request costs a sixth more here.
                    if aged_ms - lead < aged:  # noqa: PLR1730
                        aged = aged_ms - lead
                    if aged_ms < bound:  # noqa: PLR1730
                        bound = aged_ms
                if bound - lead <= now_ms:  # not ON_TIME (which goes unrecorded)
                    urgency[id(e)] = DUE if now_ms <= bound else LATE
        cut = self._budget_now(now_ms, start, due_waiting=DUE in urgency.values())
        top = self.lanes[0]
        doomed, budget, first, layout = self.realtime.triage(heads[top], start, cut, aged_ms=aged)
        draft = assemble(
            self.queues,
            self.shapes,
            budget=budget,
            max_items=s.max_items,
            realtime_share=s.realtime_share,
            urgency=urgency,
            heads=heads if first is None else {**heads, top: first},
            cost_ms=self.controller.predict_ms,  # lengths mix where it pays (budget.py)
            # Realtime due before this batch and the next at the full budget, as realtime
            # is planned (times the overrun measured), cannot wait for a batch of its length;
            # with the triage on, its layout already chose realtime's batches: all urgent.
            urgent_ms=math.inf if s.triage == "on" else start + 2 * lead * self.overrun,
        )
        # Expiring requests that would miss their deadline even if they ran in
        # this batch (the batch that would run now, or they alone if longer). Heads
        # are in deadline order: past a deadline no request of any length misses,
        # none further on does.
        predict = self.controller.predict_ms
        safe = start + predict(max(draft.padded, self.shapes.seq_buckets[-1]))
        hopeless = doomed
        gone = {id(e) for e in doomed}
        # How much later ``start`` may move before a kept request turns hopeless (a sweep
        # while the engine is busy looks again then): by the triage's layout, and by the
        # batch that would run now, for the requests judged against it below.
        slack = math.inf if layout is None else layout.slack_ms(self.shapes, predict)
        for lane in self.lanes:
            if not self.expires(lane):
                continue
            for e in heads[lane]:
                if e.deadline_ms >= safe:
                    slack = min(slack, e.deadline_ms - safe)
                    break
                if id(e) in gone:
                    continue
                alone = self.shapes.seq_len(e.bucket)
                left = e.deadline_ms - start - predict(max(draft.padded, alone))
                if left < 0:
                    hopeless.append(e)
                elif left < slack:
                    slack = left
        hold = self._hold_until(
            now_ms, draft, heads[top], start=start, cut=cut, layout=layout, aged_ms=aged
        )
        window = min(e.item.arrived_ms for e in draft.entries) + s.window_ms
        candidates = [
            (min(h[0].deadline_ms for h in heads.values() if h) - lead, "deadline"),
            (aged, "aged"),
            (max(now_ms, hold) if draft.full else math.inf, "full"),
            (max(window, hold), "window"),
        ]
        due = min(t for t, _ in candidates)
        reason = next(r for t, r in candidates if t <= max(due, now_ms))
        return _Decision(draft, hopeless, due, reason, slack)
