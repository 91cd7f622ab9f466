"""Dead-letter replay: the pure parts alone; the command against a real broker is in
tests/kafka/test_replay_live.py."""

from __future__ import annotations

import base64
import json
from collections import Counter
from typing import Any

import pytest
from click.testing import CliRunner
from support.dead_letters import dead_letter_dict

from pipeline.cli import main
from pipeline.errors import DecodeError
from pipeline.settings import Settings
from pipeline.tools.replay import (
    ALREADY_SENT,
    EXHAUSTED,
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

# -- pure parts -------------------------------------------------------------------


def _letter(offset: int = 0, partition: int = 0, **fields: Any) -> DeadLetter:
    """The dead letter at ``offset`` of dlq ``partition``: an InferenceError after 3
    attempts at 2,000 ms on inference.requests.bulk[1]@(40 + offset), unless ``fields``
    (:func:`dead_letter_dict`'s arguments) say otherwise."""
    given: dict[str, Any] = {
        "original_topic": "inference.requests.bulk",
        "original_partition": 1,
        "original_offset": 40 + offset,
        "attempts": 3,
        "failed_at_ms": 2_000,
        "request_id": f"r-{offset}",
    }
    record = dead_letter_dict(**{**given, **fields})
    return DeadLetter("inference.dlq", partition, offset, record)


def test_parse_time_accepts_epoch_ms_and_iso() -> None:
    assert parse_time("1700000000000") == 1_700_000_000_000
    assert parse_time("2023-11-14T22:13:20Z") == 1_700_000_000_000
    assert parse_time("2023-11-14T22:13:20") == 1_700_000_000_000  # naive is UTC
    assert parse_time("2023-11-14T23:13:20+01:00") == 1_700_000_000_000
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_time("yesterday")


def test_filters_select_by_every_criterion() -> None:
    rec = _letter().record
    assert Filters().matches(rec)
    assert Filters(stages=frozenset({"infer", "decode"})).matches(rec)
    assert not Filters(stages=frozenset({"decode"})).matches(rec)
    assert Filters(error_class="Inference*").matches(rec)
    assert not Filters(error_class="Decode*").matches(rec)
    assert Filters(topics=frozenset({"inference.requests.bulk"})).matches(rec)
    assert not Filters(topics=frozenset({"inference.requests.realtime"})).matches(rec)
    assert Filters(since_ms=2_000, until_ms=2_001).matches(rec)  # since inclusive
    assert not Filters(since_ms=2_001).matches(rec)
    assert not Filters(until_ms=2_000).matches(rec)  # until exclusive
    assert Filters(request_ids=frozenset({"r-0"})).matches(rec)
    assert not Filters(request_ids=frozenset({"r-9"})).matches(rec)
    assert not Filters(request_ids=frozenset({"r-0"})).matches({**rec, "request_id": None})


def test_plan_ranges_end_at_high_watermarks_and_clamp_starts() -> None:
    marks = {0: (0, 10), 1: (5, 8), 2: (3, 3)}
    assert plan_ranges(Start(), marks) == {0: (0, 10), 1: (5, 8), 2: (3, 3)}
    assert plan_ranges(Start("offset", 6), marks) == {0: (6, 10), 1: (6, 8), 2: (3, 3)}
    assert plan_ranges(Start("offset", 99), marks) == {0: (10, 10), 1: (8, 8), 2: (3, 3)}
    # time: -1 means no record that late, so nothing to read
    assert plan_ranges(Start("time", 5), marks, {0: 4, 1: -1, 2: -1}) == {
        0: (4, 10),
        1: (8, 8),
        2: (3, 3),
    }
    # group: nothing committed means the beginning; a committed offset below low is clamped
    assert plan_ranges(Start("group"), marks, {0: 7, 1: -1001, 2: 1}) == {
        0: (7, 10),
        1: (5, 8),
        2: (3, 3),
    }


def test_decide_counts_attempts_from_the_failed_records_header() -> None:
    first = _letter(0)
    again = _letter(1)  # the dead letter of a record that was replay attempt 2
    prior = {again.origin: 2}
    assert decide(first, sent={}, prior_attempts=prior, max_attempts=5) == (SEND, 1)
    assert decide(again, sent={}, prior_attempts=prior, max_attempts=5) == (SEND, 3)
    assert decide(again, sent={}, prior_attempts=prior, max_attempts=2) == (EXHAUSTED, 3)
    sent = {first.replay_id: 1}
    assert decide(first, sent=sent, prior_attempts={}, max_attempts=5) == (ALREADY_SENT, 1)
    assert decide(first, sent=sent, prior_attempts={}, max_attempts=5, force=True) == (SEND, 1)
    # --force never lifts the attempt bound
    out = decide(again, sent={again.replay_id: 1}, prior_attempts=prior, max_attempts=2, force=True)
    assert out == (EXHAUSTED, 3)


def test_summary_counts_stage_error_class_topic() -> None:
    letters = [_letter(0), _letter(1), _letter(2, error=DecodeError("not avro"))]
    counts = summarize(letters)
    assert counts == {
        ("infer", "InferenceError", "inference.requests.bulk"): 2,
        ("decode", "DecodeError", "inference.requests.bulk"): 1,
    }
    table = format_summary(counts).splitlines()
    assert table[0].split() == ["stage", "error_class", "original_topic", "count"]
    assert table[1].split() == ["infer", "InferenceError", "inference.requests.bulk", "2"]
    assert table[-1].split() == ["total", "3"]
    assert format_summary(Counter()).splitlines()[-1].split() == ["total", "0"]


def test_export_line_keeps_every_field_and_base64_bytes() -> None:
    letter = _letter(3, partition=2, key=None)
    row = json.loads(export_line(letter, attempts_so_far=2))
    assert row["replay_id"] == "inference.dlq/2/3"
    assert row["replay_attempts"] == 2
    assert row["key"] is None
    assert base64.b64decode(row["value"]) == b"\x00v"
    for name in ("stage", "error_class", "error_message", "attempts", "failed_at_ms", "worker"):
        assert row[name] == letter.record[name]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_token_bucket_holds_the_rate_with_a_fake_clock() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10, clock=clock, sleep=clock.sleep)
    assert bucket.capacity == 1
    for _ in range(51):
        bucket.acquire()
    assert clock.now - 100.0 == pytest.approx(5.0)  # the first token is free
    assert bucket.delay() == pytest.approx(0.1)
    clock.now += 60  # idle: the bucket refills only up to its burst
    burst = TokenBucket(100, clock=clock, sleep=clock.sleep)
    clock.now += 60
    taken = 0
    while burst.delay() == 0:
        taken += 1
    assert taken == 10
    with pytest.raises(ValueError):
        TokenBucket(0)


def test_commit_tracker_stops_at_the_first_unacknowledged_record() -> None:
    tracker = CommitTracker({0: (0, 10), 1: (4, 6), 2: (7, 7)}, [(0, 3), (0, 5), (1, 4)])
    assert tracker.safe() == {0: 3, 1: 4, 2: 7}
    tracker.acked(0, 5)
    assert tracker.safe() == {0: 3, 1: 4, 2: 7}  # 3 still in flight
    tracker.acked(0, 3)
    tracker.acked(1, 4)
    assert tracker.safe() == {0: 10, 1: 6, 2: 7}


def test_cli_rejects_bad_arguments_before_connecting() -> None:
    runner = CliRunner()
    cases = [
        (["--from-offset", "3", "--from-group"], "one of --from-offset"),
        (["--since", "yesterday"], "Invalid value for '--since'"),
        (["--since", "2025-01-02", "--until", "2025-01-01"], "later than --since"),
        (["--stage", "bogus"], "Invalid value for '--stage'"),
        (["--rate", "-1"], "Invalid value for '--rate'"),
        (["--max-attempts", "0"], "Invalid value for '--max-attempts'"),
    ]
    for args, message in cases:
        result = runner.invoke(main, ["replay-dlq", "-b", "127.0.0.1:1", *args])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)


def test_to_honours_the_topic_prefix() -> None:
    from pipeline.tools.commands.replay import destination_topic

    staged = Settings.from_env({"PIPELINE_TOPICS_PREFIX": "staging."})
    assert destination_topic(staged, "bulk") == "staging.inference.requests.bulk"
    assert destination_topic(staged, "fixed.inputs") == "staging.fixed.inputs"
    assert destination_topic(staged, "staging.fixed.inputs") == "staging.fixed.inputs"
    assert destination_topic(Settings.from_env({}), "fixed.inputs") == "fixed.inputs"
