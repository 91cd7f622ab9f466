"""pipeline.observability.logs: JSON or text lines, payload fields redacted unless allowed."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from pipeline.errors import ConfigurationError
from pipeline.observability.logs import (
    JsonFormatter,
    PayloadFilter,
    RepeatFilter,
    Tally,
    configure_logging,
)
from pipeline.settings import LogSettings, Settings


@pytest.fixture
def root() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A private logger tree (not the real root) with one stream handler, and only that
    one: it propagates, because pytest attaches its capture handlers (shared by every
    test of the session) to each logger that does not, and configure_logging would put
    its RepeatFilter on them: later tests' caplog then lost repeated warnings."""
    logger = logging.getLogger("test_metrics_logs.root")
    logger.setLevel(logging.INFO)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    yield logger, stream
    logger.removeHandler(handler)


def test_json_lines_carry_level_logger_message_and_extras(
    root: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = root
    configure_logging(LogSettings(format="json"), static={"app": "pipeline-x"}, root=logger)
    logger.getChild("worker").info(
        "dead letter %s", "t[0]@5", extra={"stage": "infer", "offset": 5}
    )
    line = json.loads(stream.getvalue().strip())
    assert line["level"] == "INFO"
    assert line["logger"] == "test_metrics_logs.root.worker"
    assert line["msg"] == "dead letter t[0]@5"
    assert (line["stage"], line["offset"], line["app"]) == ("infer", 5, "pipeline-x")
    assert line["ts"].endswith("+00:00") and "host" in line and "pid" in line


def test_payload_fields_are_redacted_by_default(root: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = root
    configure_logging(LogSettings(format="json"), root=logger)
    logger.info("request", extra={"text": "my secret text", "request_id": "r-1"})
    line = json.loads(stream.getvalue().strip())
    assert line["text"] == "<redacted 14>"
    assert line["request_id"] == "r-1"
    assert "my secret text" not in stream.getvalue()


def test_payloads_appear_only_when_allowed(root: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = root
    configure_logging(LogSettings(format="json"), allow_payloads=True, root=logger)
    logger.info("request", extra={"text": "visible"})
    assert json.loads(stream.getvalue().strip())["text"] == "visible"


def test_text_format_and_exceptions(root: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = root
    configure_logging(LogSettings(format="text"), root=logger)
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed")
    out = stream.getvalue()
    assert "[ERROR] test_metrics_logs.root: failed" in out
    assert "ValueError: boom" in out


def test_json_exception_and_unserialisable_extras(
    root: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = root
    configure_logging(LogSettings(format="json"), root=logger)
    try:
        raise KeyError("k")
    except KeyError:
        logger.exception("lookup", extra={"where": object()})
    line = json.loads(stream.getvalue().strip())
    assert "KeyError" in line["exc"]
    assert line["where"].startswith("<object object")


def test_configure_is_idempotent_and_sets_the_level(
    root: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = root
    for _ in range(3):
        configure_logging(LogSettings(format="json", level="warning"), root=logger)
    handler = logger.handlers[0]
    assert sum(isinstance(f, PayloadFilter) for f in handler.filters) == 1
    assert isinstance(handler.formatter, JsonFormatter)
    logger.info("dropped")
    logger.warning("kept")
    assert [json.loads(x)["msg"] for x in stream.getvalue().splitlines()] == ["kept"]


def test_a_logger_without_handlers_gets_one() -> None:
    logger = logging.getLogger("test_metrics_logs.bare")
    logger.propagate = False
    try:
        configure_logging(LogSettings(), root=logger)
        assert len(logger.handlers) == 1
    finally:
        for h in list(logger.handlers):
            logger.removeHandler(h)


def test_log_settings_from_env() -> None:
    assert Settings.from_env({}).log.format == "text"
    assert Settings.from_env({"PIPELINE_LOG_FORMAT": "json"}).log.format == "json"
    with pytest.raises(ConfigurationError, match="PIPELINE_LOG_FORMAT"):
        Settings.from_env({"PIPELINE_LOG_FORMAT": "xml"})
    with pytest.raises(ConfigurationError, match="PIPELINE_LOG_LEVEL"):
        Settings.from_env({"PIPELINE_LOG_LEVEL": "loud"})


def test_repeated_warnings_are_held_back_and_counted() -> None:
    now = [0.0]
    repeat = RepeatFilter(burst=2, window_s=10.0, clock=lambda: now[0])

    def record(level: int, msg: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord("aiokafka", level, "p", 1, msg, args, None)

    flood = [record(logging.ERROR, "Unable connect to node with id %s", i) for i in range(50)]
    assert [repeat.filter(r) for r in flood].count(True) == 2
    assert repeat.filter(record(logging.ERROR, "another kind"))
    assert all(
        repeat.filter(record(logging.INFO, "Unable connect to node with id %s", 1))
        for _ in range(10)
    ), "info lines are never held back"
    now[0] = 10.0
    later = record(logging.ERROR, "Unable connect to node with id %s", 7)
    assert repeat.filter(later)
    assert later.getMessage() == "Unable connect to node with id 7 (48 like this held back)"


def test_a_tally_logs_the_first_at_once_then_one_summary_per_window() -> None:
    now = [0.0]
    tally = Tally(window_s=10.0, clock=lambda: now[0])
    assert tally.add("realtime") == {"realtime": 1}
    now[0] = 4.0
    assert [tally.add(lane) for lane in ("realtime", "bulk", "realtime")] == [None] * 3
    now[0] = 9.9
    assert tally.add("bulk") is None  # within 10 s of the last line
    now[0] = 10.5
    assert tally.add("realtime") == {"realtime": 3, "bulk": 2}
    now[0] = 30.0
    assert tally.add("standard") == {"standard": 1}


def test_a_floods_last_counts_are_flushed_once_their_window_ends() -> None:
    now = [0.0]
    tally = Tally(window_s=10.0, clock=lambda: now[0])
    assert tally.due_in() is None and tally.flush() is None  # nothing counted
    assert tally.add("realtime") == {"realtime": 1}
    assert tally.due_in() is None  # logged at once: nothing pending
    now[0] = 3.0
    assert tally.add("bulk") is None and tally.add("bulk") is None
    assert tally.due_in() == 7.0
    now[0] = 9.0
    assert tally.flush() is None  # not before the window ends
    now[0] = 10.0
    assert tally.due_in() == 0.0 and tally.flush() == {"bulk": 2}
    assert tally.due_in() is None and tally.flush() is None
    now[0] = 15.0
    assert tally.add("realtime") is None  # within 10 s of the flushed line
    assert tally.due_in() == 5.0


def test_configure_logging_installs_the_repeat_filter_once(
    root: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = root
    configure_logging(LogSettings(format="text"), root=logger)
    configure_logging(LogSettings(format="text"), root=logger)
    for _ in range(20):
        logger.warning("broker down")
    assert stream.getvalue().count("broker down") == 5
