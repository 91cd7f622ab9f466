"""Scheduling: which requests run together, and when. Pure: no Faust, torch or asyncio.

- :mod:`.lanes`: :class:`Queued` (what it reads of a request), bounded EDF queues per
  lane, pause/resume hysteresis
- :mod:`.budget`: length buckets, the token budget, :class:`Plan`, batch assembly
- :mod:`.controller`: the latency model and the budget's closed loop
- :mod:`.triage`: which realtime requests can still make their deadline, batch by batch
- :mod:`.realtime`: the overrun realtime's plans allow for, the realtime cut and the triage's choice
- :mod:`.scheduler`: :class:`Scheduler`, the dispatch decisions (clock injected)

Wiring, in short::

    controller = Controller(settings.scheduler, slo_ms=settings.worker.lane_deadline_ms("realtime"))
    scheduler = Scheduler(settings.scheduler, expires=deadlines.expires, controller=controller)
"""

from pipeline.scheduling.budget import Plan, Shapes
from pipeline.scheduling.controller import Controller, LatencyModel
from pipeline.scheduling.lanes import Queued
from pipeline.scheduling.scheduler import Scheduler

__all__ = ["Controller", "LatencyModel", "Plan", "Queued", "Scheduler", "Shapes"]
