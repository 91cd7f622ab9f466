"""Structured logging for the worker: text or JSON lines, never payload text by default.

:func:`configure_logging` is called once at start-up (after Faust has set up
its handlers): it puts one formatter and the :class:`PayloadFilter` on every
handler of the root logger, adding a stderr handler when there is none.

Payloads reach a log record only as ``extra`` fields named in
:data:`PAYLOAD_FIELDS` (``log.info("...", extra={"text": text})``); the filter
replaces them with their length unless payload logging was asked for
(``PIPELINE_WORKER_LOG_PAYLOADS``). Message strings themselves never carry a
request's text: log ids, topics and offsets, not content.

A :class:`RepeatFilter` keeps a failing dependency from flooding the log:
while the broker is down, aiokafka logs the same few errors thousands of
times a minute. Warnings and errors of one kind (logger, level, message
template) pass at most ``burst`` times per window; the next one let through
says how many were held back.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import socket
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from pipeline.settings import LogSettings

__all__ = [
    "PAYLOAD_FIELDS",
    "JsonFormatter",
    "LibrdkafkaLog",
    "PayloadFilter",
    "RepeatFilter",
    "configure_logging",
    "librdkafka_log",
]

#: ``extra`` fields that may hold request content; redacted unless allowed.
PAYLOAD_FIELDS = frozenset({"text", "texts", "payload", "value", "key", "embedding"})

TEXT_FORMAT = "[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s"

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(
    vars(logging.LogRecord("n", logging.INFO, "p", 1, "m", None, None)).keys()
) | {"message", "asctime", "taskName"}


def _redacted(value: Any) -> str:
    try:
        size = len(value)
    except TypeError:
        return "<redacted>"
    return f"<redacted {size}>"


class PayloadFilter(logging.Filter):
    """Replaces payload ``extra`` fields with ``<redacted N>``; passes every record."""

    def __init__(self, allow_payloads: bool = False) -> None:
        super().__init__()
        self.allow_payloads = allow_payloads

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.allow_payloads:
            for name in PAYLOAD_FIELDS.intersection(record.__dict__):
                value = record.__dict__[name]
                if not (isinstance(value, str) and value.startswith("<redacted")):
                    record.__dict__[name] = _redacted(value)
        return True


class RepeatFilter(logging.Filter):
    """Passes at most ``burst`` records of one kind per ``window_s``, at ``level`` and
    above (lower levels always pass). A kind is (logger, level, message template).

    The first record of a kind let through after some were held back ends with
    ``(N like this held back)``; a flood that simply stops is not summarised.
    """

    _MAX_KINDS = 1000  # kinds remembered; older windows are forgotten past this

    def __init__(
        self,
        burst: int = 5,
        window_s: float = 10.0,
        level: int = logging.WARNING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.burst, self.window_s, self.level, self._clock = burst, window_s, level, clock
        # kind -> [window start, records passed in it, records held back]
        self._kinds: dict[tuple[str, int, str], list[float]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.level:
            return True
        now = self._clock()
        kind = (record.name, record.levelno, str(record.msg))
        state = self._kinds.get(kind)
        if state is None or now - state[0] >= self.window_s:
            held = int(state[2]) if state is not None else 0
            if state is None and len(self._kinds) >= self._MAX_KINDS:
                self._forget(now)
            self._kinds[kind] = [now, 1, 0]
            if held:
                record.msg = f"{record.msg} ({held} like this held back)"
            return True
        if state[1] < self.burst:
            state[1] += 1
            return True
        state[2] += 1
        return False

    def _forget(self, now: float) -> None:
        for kind in [k for k, v in self._kinds.items() if now - v[0] >= self.window_s]:
            del self._kinds[kind]
        if len(self._kinds) >= self._MAX_KINDS:
            self._kinds.clear()


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC, ISO 8601), ``level``, ``logger``,
    ``msg``, ``pid``, the ``static`` fields, every ``extra`` field, and ``exc``
    when there is an exception. Values JSON cannot hold are written as ``repr``."""

    def __init__(self, static: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.static = dict(static or {})

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "pid": record.process,
            **self.static,
        }
        for name, value in record.__dict__.items():
            if name not in _STANDARD and not name.startswith("_"):
                out[name] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=repr, ensure_ascii=False)


class Tally:
    """Counts events of one kind and says when to log them: the first at once, then at
    most one summary line per ``window_s`` with the count since the last line (the last
    counts of a flood too, when the caller asks :meth:`flush` at :meth:`due_in`).

    For events that come in floods and are each recorded elsewhere (an expired
    request's dead letter is in the dead-letter topic and the dead-letter metric):
    one INFO line per event cost a worker about 3 µs a request under overload
    (docs/design.md, "Floods summarised in the log"). ``clock`` is injectable.
    """

    def __init__(self, window_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.window_s, self._clock = window_s, clock
        self._logged_at: float | None = None
        self._counts: dict[str, int] = {}

    def add(self, kind: str) -> dict[str, int] | None:
        """Count one ``kind``; the counts to log now (then reset), or None."""
        self._counts[kind] = self._counts.get(kind, 0) + 1
        now = self._clock()
        if self._logged_at is not None and now - self._logged_at < self.window_s:
            return None
        self._logged_at = now
        counts, self._counts = self._counts, {}
        return counts

    def due_in(self) -> float | None:
        """Seconds until the counts not logged yet may be (0: now); None when there are
        none. The caller that wants a flood's last counts logged asks :meth:`flush` then."""
        if not self._counts or self._logged_at is None:
            return None
        return max(0.0, self._logged_at + self.window_s - self._clock())

    def flush(self) -> dict[str, int] | None:
        """The counts not logged yet, once their window has passed (then reset, as a
        line logged by :meth:`add`); None when there are none or it has not passed."""
        if self.due_in() != 0.0:
            return None
        self._logged_at = self._clock()
        counts, self._counts = self._counts, {}
        return counts


def configure_logging(
    settings: LogSettings,
    *,
    allow_payloads: bool = False,
    static: Mapping[str, Any] | None = None,
    root: logging.Logger | None = None,
) -> logging.Formatter:
    """Install the formatter of ``settings.format``, a :class:`RepeatFilter` and a
    :class:`PayloadFilter` on every handler of ``root`` (the root logger by
    default); idempotent.

    ``static`` fields (e.g. ``{"app": app_id}``) go into every JSON line;
    ``host`` is always there. Returns the formatter installed.
    """
    root = root if root is not None else logging.getLogger()
    if settings.level:
        root.setLevel(settings.level.upper())
    formatter: logging.Formatter
    if settings.format == "json":
        formatter = JsonFormatter({"host": socket.gethostname(), **(static or {})})
    else:
        formatter = logging.Formatter(TEXT_FORMAT)
    if not root.handlers:
        root.addHandler(logging.StreamHandler(sys.stderr))
    for handler in root.handlers:
        handler.setFormatter(formatter)
        for old in [f for f in handler.filters if isinstance(f, PayloadFilter | RepeatFilter)]:
            handler.removeFilter(old)
        handler.addFilter(RepeatFilter())
        handler.addFilter(PayloadFilter(allow_payloads))
    return formatter


class LibrdkafkaLog:
    """confluent-kafka's ``logger`` option: librdkafka's own log lines into Python
    logging (logger ``librdkafka``) instead of raw to stderr.

    librdkafka logs every failed connection attempt at syslog level 3 and retries
    it itself; what cannot be retried reaches the caller as an error or an
    exception, which the pipeline turns into one line naming the setting to fix.
    So its errors and warnings (syslog 0-4) are logged at INFO and the rest at
    DEBUG: a command run without logging set up shows none of them, a worker at
    ``-l info`` shows the first kind.
    """

    def __init__(self, name: str = "librdkafka") -> None:
        self.logger = logging.getLogger(name)

    def log(self, level: int, msg: str, *args: Any) -> None:
        """Called by confluent-kafka with a Python logging level (mapped from syslog's)."""
        ours = logging.INFO if level >= logging.WARNING else logging.DEBUG
        self.logger.log(ours, msg, *args)
        self.seen(msg % args if args else msg)

    def seen(self, line: str) -> None:
        """Hook for subclasses that wait for a state librdkafka only logs."""


def librdkafka_log() -> dict[str, Any]:
    """The client options that route librdkafka's log lines through :class:`LibrdkafkaLog`."""
    return {"logger": LibrdkafkaLog()}


def serve_logs(*clients: Any) -> None:
    """Hand the log lines librdkafka queued for ``clients`` to logging. librdkafka queues
    them for ``poll``, which admin clients and consumers used only for lookups never
    call. Never raises: a closed client has nothing to serve, and a caller's own error
    must not be masked by this one's."""
    for client in clients:
        with contextlib.suppress(Exception):
            client.poll(0)
