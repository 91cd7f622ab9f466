"""Dead-letter replay, the pure parts: no broker, no clock of their own.

Time parsing, filters, range planning, the per-letter decision, the summary
table, export lines, the token bucket and the commit tracker. ``run`` drives
them against a real broker; tests drive them alone.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = [
    "ALREADY_SENT",
    "ATTEMPT_HEADER",
    "DEFAULT_GROUP",
    "DEFAULT_MAX_ATTEMPTS",
    "EXHAUSTED",
    "ID_HEADER",
    "SEND",
    "CommitTracker",
    "DeadLetter",
    "Filters",
    "Start",
    "TokenBucket",
    "decide",
    "export_line",
    "format_summary",
    "parse_time",
    "plan_ranges",
    "summarize",
]

ID_HEADER = "pipeline-replay-id"
ATTEMPT_HEADER = "pipeline-replay-attempt"
DEFAULT_GROUP = "pipeline-replay"
DEFAULT_MAX_ATTEMPTS = 5

SEND, ALREADY_SENT, EXHAUSTED = "send", "already sent", "over max attempts"


def parse_time(text: str) -> int:
    """Epoch milliseconds from ``text``: an integer (epoch ms) or ISO 8601 (naive = UTC).

    Raises ValueError saying what was expected.
    """
    s = text.strip()
    if re.fullmatch(r"\d+", s):
        return int(s)
    try:
        when = datetime.fromisoformat(s)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither epoch milliseconds nor an ISO 8601 time "
            "(e.g. 2025-06-01T12:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


@dataclass(frozen=True)
class DeadLetter:
    """One decoded DeadLetter and where it sits in the dead-letter topic."""

    topic: str
    partition: int
    offset: int
    record: dict[str, Any]

    @property
    def replay_id(self) -> str:
        """Stable id of this dead letter: ``dlq-topic/partition/offset``."""
        return f"{self.topic}/{self.partition}/{self.offset}"

    @property
    def origin(self) -> tuple[str, int, int]:
        """Where its input was: ``(topic, partition, offset)``."""
        r = self.record
        return (r["original_topic"], int(r["original_partition"]), int(r["original_offset"]))


@dataclass(frozen=True)
class Filters:
    """Which dead letters to select; an empty criterion selects everything.

    ``error_class`` is a glob (fnmatch); ``since_ms`` is inclusive and
    ``until_ms`` exclusive, both compared with ``failed_at_ms``.
    """

    stages: frozenset[str] = frozenset()
    error_class: str | None = None
    topics: frozenset[str] = frozenset()
    since_ms: int | None = None
    until_ms: int | None = None
    request_ids: frozenset[str] | None = None

    def matches(self, record: Mapping[str, Any]) -> bool:
        if self.stages and record["stage"] not in self.stages:
            return False
        if self.error_class and not fnmatch.fnmatchcase(record["error_class"], self.error_class):
            return False
        if self.topics and record["original_topic"] not in self.topics:
            return False
        failed = int(record["failed_at_ms"])
        if self.since_ms is not None and failed < self.since_ms:
            return False
        if self.until_ms is not None and failed >= self.until_ms:
            return False
        return self.request_ids is None or record.get("request_id") in self.request_ids


@dataclass(frozen=True)
class Start:
    """Where reading starts in each dead-letter partition.

    ``beginning``; ``offset`` (``value``, the same in every partition); ``time``
    (``value`` in epoch ms, looked up with offsets_for_times); ``group`` (the
    replay group's committed offsets; the beginning where it has none).
    """

    kind: Literal["beginning", "offset", "time", "group"] = "beginning"
    value: int | None = None


def plan_ranges(
    start: Start,
    watermarks: Mapping[int, tuple[int, int]],
    looked_up: Mapping[int, int] | None = None,
) -> dict[int, tuple[int, int]]:
    """``{partition: (first, end)}`` to read, ``end`` being the high watermark.

    ``watermarks`` holds ``(low, high)`` per partition; ``looked_up`` the offsets
    found for ``time`` (negative: no record that late, read nothing) or
    ``group`` (negative: nothing committed, read from the beginning).
    Every start is clamped into ``[low, high]``, so a range is never negative.
    """
    found = looked_up or {}
    ranges: dict[int, tuple[int, int]] = {}
    for partition, (low, high) in watermarks.items():
        if start.kind == "offset":
            first = int(start.value or 0)
        elif start.kind == "time":
            first = found.get(partition, -1)
            first = high if first < 0 else first
        elif start.kind == "group":
            first = found.get(partition, -1)
            first = low if first < 0 else first
        else:
            first = low
        ranges[partition] = (min(max(first, low), high), high)
    return ranges


def decide(
    letter: DeadLetter,
    *,
    sent: Mapping[str, int],
    prior_attempts: Mapping[tuple[str, int, int], int],
    max_attempts: int,
    force: bool = False,
) -> tuple[str, int]:
    """``(outcome, attempt)`` for one selected dead letter.

    ``attempt`` is the number this replay would carry: one more than the
    attempt header of the record that failed (the dead letter's input), or 1.
    ``sent`` counts replayed records per replay id; ``force`` ignores it, but
    never ``max_attempts``, so a record that keeps failing cannot loop forever.
    """
    attempt = prior_attempts.get(letter.origin, 0) + 1
    if not force and sent.get(letter.replay_id, 0) > 0:
        return ALREADY_SENT, attempt
    if attempt > max_attempts:
        return EXHAUSTED, attempt
    return SEND, attempt


def summarize(letters: Iterable[DeadLetter]) -> Counter[tuple[str, str, str]]:
    """Counts by ``(stage, error_class, original_topic)``."""
    return Counter(
        (d.record["stage"], d.record["error_class"], d.record["original_topic"]) for d in letters
    )


def format_summary(counts: Mapping[tuple[str, str, str], int]) -> str:
    """A plain-text table of ``summarize``'s counts, largest first, with a total."""
    rows = [("stage", "error_class", "original_topic", "count")]
    rows += [(*key, str(n)) for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    rows.append(("total", "", "", str(sum(counts.values()))))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [
        "  ".join(
            [*(c.ljust(w) for c, w in zip(r[:3], widths[:3], strict=True)), r[3].rjust(widths[3])]
        )
        for r in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def export_line(letter: DeadLetter, attempts_so_far: int = 0) -> str:
    """One JSON line: every DeadLetter field (key and value base64) and where it sits."""
    rec = dict(letter.record)
    for name in ("key", "value"):
        raw = rec.get(name)
        rec[name] = None if raw is None else base64.b64encode(raw).decode("ascii")
    return json.dumps(
        {
            "replay_id": letter.replay_id,
            "dlq_topic": letter.topic,
            "dlq_partition": letter.partition,
            "dlq_offset": letter.offset,
            "replay_attempts": attempts_so_far,
            **rec,
        },
        sort_keys=True,
    )


class TokenBucket:
    """At most ``rate`` tokens a second, bursts up to ``burst``; clock and sleep injected."""

    def __init__(
        self,
        rate: float,
        *,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.capacity = burst if burst is not None else max(1.0, rate / 10)
        self._tokens = self.capacity
        self._clock = clock
        self._sleep = sleep
        self._last = clock()

    def delay(self) -> float:
        """Take a token and return 0.0, or return the seconds until one is due."""
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens >= 1 - 1e-9:  # tolerate float rounding after a computed sleep
            self._tokens = max(0.0, self._tokens - 1)
            return 0.0
        return (1 - self._tokens) / self.rate

    def acquire(self) -> float:
        """Block until a token is taken; return the seconds slept."""
        slept = 0.0
        while (wait := self.delay()) > 0:
            self._sleep(wait)
            slept += wait
        return slept


class CommitTracker:
    """Per partition, the offset below which every record is handled.

    Every record in the ranges is handled except the ones to send, until the
    broker acknowledges them; ``safe()`` stops at the first one not
    acknowledged (in flight, not yet sent, or failed), so committing it loses
    nothing.
    """

    def __init__(
        self, ranges: Mapping[int, tuple[int, int]], to_send: Iterable[tuple[int, int]]
    ) -> None:
        self._end = {p: end for p, (_first, end) in ranges.items()}
        self._waiting: dict[int, set[int]] = {p: set() for p in ranges}
        for partition, offset in to_send:
            self._waiting[partition].add(offset)

    def acked(self, partition: int, offset: int) -> None:
        self._waiting[partition].discard(offset)

    def safe(self) -> dict[int, int]:
        """``{partition: offset to commit}``."""
        return {p: min(self._waiting[p], default=end) for p, end in self._end.items()}
