"""Faust's recovery of the stored results, watched: a partition that receives
nothing is read again, then let go.

Faust holds a partition's lanes until the dedupe table's changelog partition is
restored up to the highwater it read at the rebalance. Once, in a fault test (a
worker stopped past its session, then resumed), a changelog partition that needed
46 records received none of them for 90 s: Faust logged "No event received for
active tp" every 5 s and its lanes went unanswered until the worker stopped
(docs/design.md, "A stalled recovery"). Where the records went was not found: the
fetcher sent requests (Faust's own check stayed quiet) and the recovery's seek had
been made. The stored results are a cache, so a partition is never worth a lane:

- a partition whose recovery received no record for ``stall_s`` is sought again
  to where its recovery stands, on the consumer's thread (a dropped fetch is
  fetched again; Faust's read offset is reset with it);
- after :data:`READINGS` such readings without a record, its recovery is let go:
  the offsets it still lacked are counted as read, so the recovery ends, and
  the inputs whose results those records held are computed again.

Each action is one WARNING naming the partition, its offsets and the consumer's
position (the facts a next look at the cause needs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

__all__ = ["READINGS", "RecoveryWatch", "stalled"]

log = logging.getLogger(__name__)

#: Readings again of a stalled partition before its recovery is let go.
READINGS = 2


def stalled(
    now: float,
    started_at: float,
    remaining: Mapping[Any, int],
    *,
    last_event_at: Mapping[Any, float],
    last_action_at: Mapping[Any, float],
    stall_s: float,
) -> list[Any]:
    """The partitions with records still to restore that received none for ``stall_s``
    since the recovery started, their last record, or the last action on them."""
    out = []
    for tp, left in remaining.items():
        if left <= 0:
            continue
        last = max(last_event_at.get(tp, started_at), last_action_at.get(tp, started_at))
        since = max(started_at, last)
        if now - since >= stall_s:
            out.append(tp)
    return sorted(out)


class RecoveryWatch:
    """Watches ``recovery`` (Faust's ``app.tables.recovery``); :meth:`check` acts.

    Promises: while a recovery runs, a changelog partition it still needs that
    received no record for ``stall_s`` is sought again (``seek_wait``, Faust's
    consumer call) at most :data:`READINGS` times, ``stall_s`` apart; a stall after
    those ends its recovery with the offsets it lacked counted as read. Standby
    partitions (which hold no lane) and a recovery making progress are let be.
    State is kept per recovery: a new one starts with no readings counted, and
    nothing judged in one is done to the next (the consumer's position, read for
    the log before acting, may take a while), nor after a record came meanwhile.
    """

    def __init__(
        self,
        recovery: Any,
        seek_wait: Callable[[Mapping[Any, int]], Awaitable[None]],
        position: Callable[[Any], Awaitable[int | None]],
        *,
        stall_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_action: Callable[[str], None] | None = None,
    ) -> None:
        self._recovery = recovery
        self._seek_wait = seek_wait
        self._position = position
        self._stall_s = stall_s
        self._clock = clock  # Faust's recovery times are time.monotonic()'s
        self._on_action = on_action
        self._started_at: float | None = None
        self._readings: dict[Any, int] = {}
        self._acted_at: dict[Any, float] = {}

    async def check(self) -> list[tuple[Any, str]]:
        """Act on the stalled partitions now; returns ``(partition, action)`` pairs,
        action ``"read-again"`` or ``"let-go"``."""
        r = self._recovery
        started_at = r._recovery_started_at
        if not r.in_recovery or started_at is None:
            return []
        if started_at != self._started_at:  # a new recovery: nothing counted yet
            self._started_at = started_at
            self._readings.clear()
            self._acted_at.clear()
        active = r.active_tps
        remaining = {tp: n for tp, n in r.active_remaining().items() if tp in active}
        now = self._clock()
        done: list[tuple[Any, str]] = []
        for tp in stalled(
            now,
            started_at,
            remaining,
            last_event_at=r._active_events_received_at,
            last_action_at=self._acted_at,
            stall_s=self._stall_s,
        ):
            self._acted_at[tp] = now
            readings = self._readings.get(tp, 0)
            offset, highwater = r.active_offsets[tp], r.active_highwaters[tp]
            quiet_s = now - max(started_at, r._active_events_received_at.get(tp, started_at))
            at = await self._position_or_none(tp)
            if r._recovery_started_at != started_at or not r.in_recovery:
                break  # ended or restarted while the position was read: a new recovery
            if r.active_offsets[tp] != offset:
                continue  # a record came while the position was read: not stalled
            if readings < READINGS:
                self._readings[tp] = readings + 1
                log.warning(
                    "dedupe changelog %s[%d]: recovery received nothing for %.0f s (at offset "
                    "%s of %s, the consumer at %s); reading it again from %s",
                    tp.topic, tp.partition, quiet_s, offset, highwater, at, max(offset, 0),
                )  # fmt: skip
                # Revoked meanwhile: a new recovery. Bounded: the next check must come.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._seek_wait({tp: max(offset, 0)}), self._stall_s)
                done.append((tp, "read-again"))
            else:
                r.active_offsets[tp] = highwater
                log.warning(
                    "dedupe changelog %s[%d]: recovery received nothing after %d readings "
                    "(at offset %s of %s, the consumer at %s); let go: the results of "
                    "offsets %s..%s are not restored, and their inputs are computed again",
                    tp.topic, tp.partition, readings, offset, highwater, at, offset + 1,
                    highwater,
                )  # fmt: skip
                done.append((tp, "let-go"))
            if self._on_action is not None:
                self._on_action(done[-1][1])
        if any(action == "let-go" for _, action in done):
            self._end_if_complete()
        return done

    def _end_if_complete(self) -> None:
        """End the recovery as Faust's own loop does once nothing remains (it checks
        only on a record or after 5 s without one, and may be the part that stalled)."""
        r = self._recovery
        if r.in_recovery and not r.need_recovery():
            r.flush_buffers()
            r._set_recovery_ended()
            r.signal_recovery_end.set()

    async def _position_or_none(self, tp: Any) -> int | None:
        try:
            return await asyncio.wait_for(self._position(tp), self._stall_s)
        except Exception:  # a reset under way, or revoked: the log says "None"
            return None
