"""The priority lanes as data: each lane's definition, and its values built once from settings.

A lane is defined once, in :data:`DEFINITIONS` (highest first): its name and
what load shedding does to it. Everything else about it is a setting, read
from the section that owns it and gathered into a :class:`Lane` by
:func:`lanes_of`, the one place that finds a lane's settings by its name:

- its topic: ``PIPELINE_TOPICS_<LANE>`` (:class:`~.kafka.TopicSettings`);
- its default deadline: ``PIPELINE_WORKER_LANE_DEADLINE_MS_<LANE>``;
- how long it waits for higher lanes: ``PIPELINE_SCHEDULER_MAX_WAIT_MS_<LANE>``
  (every lane but the top one, which waits for none);
- the share of every batch reserved for it: ``PIPELINE_SCHEDULER_REALTIME_SHARE``
  for the top lane, none for the others;
- whether its late requests expire: ``PIPELINE_WORKER_EXPIRE_LANES``.

The README's "Adding a lane or a task" says which files a new lane touches.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.settings import Settings

__all__ = ["DEFINITIONS", "LANES", "Lane", "LaneDefinition", "Shed", "lanes_of", "shed_lanes"]


class Shed(enum.Enum):
    """What load shedding (:mod:`pipeline.scheduling.degrade`) does to a lane."""

    #: Never shed: its deadline misses are what shedding watches.
    WATCHED = "watched"
    #: Level 2 and up: its late requests expire, and its deadline budget shrinks.
    EXPIRE_EARLY = "expire early"
    #: Level 1 and up: its topic is paused (nothing is lost; it is read later).
    PAUSE = "pause"


@dataclasses.dataclass(frozen=True)
class LaneDefinition:
    """What a lane is, before any setting: its name and its place in load shedding."""

    name: str
    shed: Shed


#: Every lane, highest priority first.
DEFINITIONS: tuple[LaneDefinition, ...] = (
    LaneDefinition("realtime", Shed.WATCHED),
    LaneDefinition("standard", Shed.EXPIRE_EARLY),
    LaneDefinition("bulk", Shed.PAUSE),
)

#: The lanes' names, highest first.
LANES: tuple[str, ...] = tuple(d.name for d in DEFINITIONS)


def shed_lanes(shed: Shed) -> frozenset[str]:
    """The lanes load shedding treats as ``shed`` says."""
    return frozenset(d.name for d in DEFINITIONS if d.shed is shed)


@dataclasses.dataclass(frozen=True)
class Lane:
    """One lane with its settings resolved (see the module's promise)."""

    name: str
    #: 0 for the highest lane, then 1, 2, ...
    rank: int
    #: The full topic name, prefix included.
    topic: str
    #: A request's deadline when it sets none: this long after it was created.
    deadline_ms: int
    #: Longest wait for higher lanes (aging); None for the top lane.
    max_wait_ms: int | None
    #: Share of every batch kept for this lane's requests (0: none).
    reserved_share: float
    #: Whether a late request is dead-lettered (stage expired) rather than run late.
    expires: bool
    shed: Shed


def lanes_of(settings: Settings) -> tuple[Lane, ...]:
    """Every lane with its settings, highest first."""
    s = settings
    return tuple(
        Lane(
            name=d.name,
            rank=rank,
            topic=s.topics.lane_topic(d.name),
            deadline_ms=s.worker.lane_deadline_ms(d.name),
            max_wait_ms=s.scheduler.max_wait_ms(d.name),
            reserved_share=s.scheduler.realtime_share if rank == 0 else 0.0,
            expires=s.worker.expires(d.name),
            shed=d.shed,
        )
        for rank, d in enumerate(DEFINITIONS)
    )
