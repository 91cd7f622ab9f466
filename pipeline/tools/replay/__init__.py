"""Dead-letter replay: inspect, fix and resend dead letters without code.

``plan`` holds the pure parts (time parsing, filters, range planning, the
per-letter decision, summaries, export lines, the token bucket, the commit
tracker); ``kafka`` the consumer that reads bounded ranges; ``run`` the
``replay`` driver and its commit order. Import from here.
"""

from __future__ import annotations

from pipeline.tools.replay.plan import (
    ALREADY_SENT,
    ATTEMPT_HEADER,
    DEFAULT_GROUP,
    DEFAULT_MAX_ATTEMPTS,
    EXHAUSTED,
    ID_HEADER,
    SEND,
    CommitTracker,
    DeadLetter,
    Filters,
    Start,
    TokenBucket,
    decide,
    export_line,
    format_summary,
    parse_time,
    plan_ranges,
    summarize,
)
from pipeline.tools.replay.run import SCAN_MARGIN_MS, ReplayOptions, ReplayReport, replay

__all__ = [
    "ALREADY_SENT",
    "ATTEMPT_HEADER",
    "DEFAULT_GROUP",
    "DEFAULT_MAX_ATTEMPTS",
    "EXHAUSTED",
    "ID_HEADER",
    "SCAN_MARGIN_MS",
    "SEND",
    "CommitTracker",
    "DeadLetter",
    "Filters",
    "ReplayOptions",
    "ReplayReport",
    "Start",
    "TokenBucket",
    "decide",
    "export_line",
    "format_summary",
    "parse_time",
    "plan_ranges",
    "replay",
    "summarize",
]
