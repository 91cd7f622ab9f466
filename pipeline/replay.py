"""Dead-letter replay: read the dead-letter topic, select, send the inputs through again.

A run always terminates, and is safe to repeat:

1. read the dead-letter topic's end offsets (high watermarks) first: the range
   ends there, whatever arrives meanwhile;
2. read ``[start, end)`` of every partition, decode, filter: the selection;
3. scan the destination topics, from the oldest selected input's timestamp, for
   records with a ``pipeline-replay-id`` header: what was already sent, and how
   many times each replayed record had been replayed (its lineage);
4. send each selected input's key and value, untouched, with the two headers,
   at most ``rate`` a second; commit the group's offsets only for records the
   broker acknowledged (idempotent producer, ``acks=all``), in offset order.

The pure parts (time parsing, filters, range planning, decisions, the summary,
the token bucket, the commit tracker) need no broker and are tested alone.
"""

from __future__ import annotations

import base64
import fnmatch
import functools
import hashlib
import json
import logging
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any, Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from tqdm import tqdm

from pipeline.codec import dead_letter_codec
from pipeline.errors import BrokerUnavailable, ConfigurationError, DecodeError, PublishError
from pipeline.settings import Settings

__all__ = [
    "ATTEMPT_HEADER",
    "DEFAULT_GROUP",
    "DEFAULT_MAX_ATTEMPTS",
    "ID_HEADER",
    "STAGES",
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

log = logging.getLogger(__name__)

ID_HEADER = "pipeline-replay-id"
ATTEMPT_HEADER = "pipeline-replay-attempt"
STAGES = ("decode", "validate", "infer", "expired", "publish")
DEFAULT_GROUP = "pipeline-replay"
DEFAULT_MAX_ATTEMPTS = 5
#: The destination scan starts this long before the oldest selected input,
#: for producers whose clocks run behind the broker's.
SCAN_MARGIN_MS = 5 * 60 * 1000

SEND, ALREADY_SENT, EXHAUSTED = "send", "already sent", "over max attempts"


# -- pure parts -----------------------------------------------------------------


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


# -- Kafka ----------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayOptions:
    """What one ``replay`` run does (see the CLI's ``replay-dlq`` for each one's meaning)."""

    start: Start = Start()
    filters: Filters = Filters()
    dlq_topic: str | None = None  # default: the settings' dead-letter topic
    to_topic: str | None = None
    rate: float = 0.0  # records a second; 0 is unbounded
    dry_run: bool = False
    force: bool = False
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    group: str = DEFAULT_GROUP
    connect_timeout_s: float = 10.0
    progress: bool = True


@dataclass
class ReplayReport:
    """What a run found and did."""

    dlq_topic: str
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    read: int = 0
    undecodable: int = 0
    summary: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    exhausted: list[str] = field(default_factory=list)
    missing_topics: set[str] = field(default_factory=set)
    scanned: int = 0
    sent: int = 0
    acked: int = 0
    exported: int = 0
    committed: dict[int, int] = field(default_factory=dict)
    send_s: float = 0.0
    elapsed_s: float = 0.0

    def line(self) -> str:
        """One human line: what was read, selected, sent and skipped."""
        rate = f" ({self.acked / self.send_s:.0f}/s)" if self.send_s > 0 and self.acked else ""
        return (
            f"read {self.read} dead letters ({self.undecodable} undecodable), "
            f"selected {sum(self.summary.values())}: "
            f"replayed {self.acked}{rate}, already sent {self.outcomes[ALREADY_SENT]}, "
            f"over max attempts {self.outcomes[EXHAUSTED]}; {self.elapsed_s:.1f} s"
        )


def _headers(msg: Any) -> dict[str, bytes]:
    return {k: v if isinstance(v, bytes) else v.encode() for k, v in (msg.headers() or []) if v}


def _where(msg: Any) -> tuple[str, int, int]:
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


class _Kafka:
    """The replay's clients; every confluent-kafka error leaves as a pipeline error."""

    def __init__(self, settings: Settings, options: ReplayOptions) -> None:
        self.bootstrap = settings.kafka.bootstrap_servers
        self.timeout = options.connect_timeout_s
        base = {"bootstrap.servers": self.bootstrap, "log_level": 0}
        self.conf = {**base, "client.id": settings.kafka.client_id + "-replay"}
        self.consumer = Consumer(
            {
                **self.conf,
                "group.id": options.group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        try:
            self.topics: dict[str, int] = {
                name: len(meta.partitions)
                for name, meta in self.consumer.list_topics(timeout=self.timeout).topics.items()
                if meta.error is None
            }
        except KafkaException as exc:
            self.consumer.close()
            raise BrokerUnavailable(
                f"no broker answered at {self.bootstrap} within {self.timeout:.0f} s ({exc}); "
                "start one with `pipeline kafka up` or set PIPELINE_KAFKA_BOOTSTRAP_SERVERS"
            ) from exc

    def require(self, topic: str, what: str) -> int:
        if topic not in self.topics:
            raise ConfigurationError(f"{what} topic {topic!r} does not exist at {self.bootstrap}")
        return self.topics[topic]

    def watermarks(self, topic: str) -> dict[int, tuple[int, int]]:
        """``{partition: (low, high)}``; retries while a new topic's leader is elected."""
        marks: dict[int, tuple[int, int]] = {}
        for p in range(self.topics[topic]):
            for attempt in range(10):
                try:
                    low, high = self.consumer.get_watermark_offsets(
                        TopicPartition(topic, p), self.timeout
                    )
                    break
                except KafkaException as exc:
                    err = exc.args[0] if exc.args else None
                    retriable = isinstance(err, KafkaError) and err.retriable()
                    if not retriable or attempt == 9:
                        raise BrokerUnavailable(
                            f"{topic}: could not read end offsets: {exc}"
                        ) from exc
                    time.sleep(0.5)
            marks[p] = (low, high)
        return marks

    def offsets_for_times(self, topic: str, when_ms: int) -> dict[int, int]:
        tps = [TopicPartition(topic, p, max(0, when_ms)) for p in range(self.topics[topic])]
        try:
            found = self.consumer.offsets_for_times(tps, timeout=self.timeout)
        except KafkaException as exc:
            raise BrokerUnavailable(f"{topic}: offsets_for_times failed: {exc}") from exc
        return {tp.partition: tp.offset for tp in found}

    def committed(self, topic: str) -> dict[int, int]:
        tps = [TopicPartition(topic, p) for p in range(self.topics[topic])]
        try:
            found = self.consumer.committed(tps, timeout=self.timeout)
        except KafkaException as exc:
            raise BrokerUnavailable(f"{topic}: could not read committed offsets: {exc}") from exc
        return {tp.partition: tp.offset for tp in found}

    def read(
        self, ranges: Mapping[tuple[str, int], tuple[int, int]], *, desc: str, progress: bool
    ) -> Iterator[Any]:
        """Yield every record in ``[first, end)`` of each partition, then stop."""
        todo = {tp: r for tp, r in ranges.items() if r[0] < r[1]}
        if not todo:
            return
        total = sum(end - first for first, end in todo.values())
        bar = tqdm(
            total=total,
            desc=desc,
            unit=" rec",
            file=sys.stderr,
            disable=None if progress else True,
            leave=False,
        )
        self.consumer.assign([TopicPartition(t, p, first) for (t, p), (first, _) in todo.items()])
        last_progress = time.monotonic()
        try:
            while todo:
                msgs = self.consumer.consume(500, timeout=0.5)
                if not msgs:
                    self._drop_finished(todo)  # gaps (compaction, control records)
                    if todo and time.monotonic() - last_progress > max(30.0, self.timeout):
                        raise BrokerUnavailable(
                            f"no records from {sorted(todo)} for 30 s; is the broker up?"
                        )
                    continue
                last_progress = time.monotonic()
                for msg in msgs:
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            continue
                        raise BrokerUnavailable(f"reading {msg.topic()}: {err}")
                    topic, partition, offset = _where(msg)
                    rng = todo.get((topic, partition))
                    if rng is None or offset >= rng[1]:
                        continue
                    bar.update(1)
                    yield msg
                    if offset + 1 >= rng[1]:
                        del todo[(topic, partition)]
                        self.consumer.pause([TopicPartition(topic, partition)])
        except KafkaException as exc:
            raise BrokerUnavailable(str(exc)) from exc
        finally:
            bar.close()
            self.consumer.unassign()

    def _drop_finished(self, todo: dict[tuple[str, int], tuple[int, int]]) -> None:
        positions = self.consumer.position([TopicPartition(t, p) for t, p in todo])
        for tp in positions:
            key = (tp.topic, tp.partition)
            if tp.offset >= 0 and tp.offset >= todo[key][1]:
                del todo[key]

    def commit(self, topic: str, offsets: Mapping[int, int]) -> None:
        tps = [TopicPartition(topic, p, off) for p, off in offsets.items()]
        try:
            self.consumer.commit(offsets=tps, asynchronous=False)
        except KafkaException as exc:
            raise BrokerUnavailable(f"could not commit {topic} offsets: {exc}") from exc

    def close(self) -> None:
        self.consumer.close()


def _select(
    kafka: _Kafka, dlq: str, options: ReplayOptions, report: ReplayReport
) -> list[DeadLetter]:
    """Steps 1 and 2: end offsets first, then read, decode and filter."""
    watermarks = kafka.watermarks(dlq)
    looked_up: dict[int, int] | None = None
    if options.start.kind == "time":
        looked_up = kafka.offsets_for_times(dlq, int(options.start.value or 0))
    elif options.start.kind == "group":
        looked_up = kafka.committed(dlq)
    report.ranges = plan_ranges(options.start, watermarks, looked_up)
    codec = dead_letter_codec()
    chosen: list[DeadLetter] = []
    ranges = {(dlq, p): r for p, r in report.ranges.items()}
    for msg in kafka.read(ranges, desc="reading dead letters", progress=options.progress):
        report.read += 1
        try:
            record = codec.decode(msg.value())
        except DecodeError:
            report.undecodable += 1
            continue
        if options.filters.matches(record):
            _topic, partition, offset = _where(msg)
            chosen.append(DeadLetter(dlq, partition, offset, record))
    return chosen


def _scan(
    kafka: _Kafka, topics: set[str], since_ms: int, report: ReplayReport, progress: bool
) -> tuple[Counter[str], dict[tuple[str, int, int], tuple[int, bytes]]]:
    """Step 3: replay ids already sent; the attempt header and bytes' digest of every
    replayed record, by position."""
    ranges: dict[tuple[str, int], tuple[int, int]] = {}
    for topic in sorted(topics):
        if topic not in kafka.topics:
            report.missing_topics.add(topic)
            continue
        starts = kafka.offsets_for_times(topic, since_ms)
        for p, (_low, high) in kafka.watermarks(topic).items():
            first = starts.get(p, -1)
            ranges[(topic, p)] = (high if first < 0 else first, high)
    sent: Counter[str] = Counter()
    attempts: dict[tuple[str, int, int], tuple[int, bytes]] = {}
    for msg in kafka.read(ranges, desc="checking earlier replays", progress=progress):
        report.scanned += 1
        headers = _headers(msg)
        rid = headers.get(ID_HEADER)
        if rid is None:
            continue
        sent[rid.decode(errors="replace")] += 1
        try:
            attempt = int(headers.get(ATTEMPT_HEADER, b"1"))
        except ValueError:
            attempt = 1
        attempts[_where(msg)] = (attempt, _digest(msg.key(), msg.value()))
    return sent, attempts


def _digest(key: bytes | None, value: bytes | None) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in (key, value):
        h.update(b"\x00" if part is None else b"\x01" + len(part).to_bytes(8, "little") + part)
    return h.digest()


def _lineage(
    chosen: Iterable[DeadLetter], replayed: Mapping[tuple[str, int, int], tuple[int, bytes]]
) -> dict[tuple[str, int, int], int]:
    """Attempts so far of each dead letter whose input was a replayed record.

    A position matches only when the bytes match too, so a topic recreated
    (offsets reused) cannot lend one record another's history.
    """
    found: dict[tuple[str, int, int], int] = {}
    for letter in chosen:
        hit = replayed.get(letter.origin)
        if hit is not None and hit[1] == _digest(letter.record["key"], letter.record["value"]):
            found[letter.origin] = hit[0]
    return found


def replay(
    settings: Settings,
    options: ReplayOptions,
    *,
    export: IO[str] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> ReplayReport:
    """Replay the selected dead letters (see the module's steps); return what happened.

    With ``options.dry_run`` or ``export`` nothing is produced and nothing
    committed. Raises BrokerUnavailable, ConfigurationError (a missing topic)
    or PublishError (records not acknowledged: the group's offsets then stop
    before the first of them, so a rerun sends them again).
    """
    started = clock()
    dlq = options.dlq_topic or settings.topics.dlq_topic
    report = ReplayReport(dlq_topic=dlq)
    kafka = _Kafka(settings, options)
    try:
        kafka.require(dlq, "dead-letter")
        if options.to_topic:
            kafka.require(options.to_topic, "destination (--to)")
        chosen = _select(kafka, dlq, options, report)
        report.summary = summarize(chosen)
        dests = {options.to_topic} if options.to_topic else set()
        since = min((int(d.record["original_timestamp_ms"]) for d in chosen), default=0)
        sent, replayed = (
            _scan(
                kafka,
                dests | {d.origin[0] for d in chosen},
                since - SCAN_MARGIN_MS,
                report,
                options.progress,
            )
            if chosen
            else (Counter(), {})
        )
        attempts = _lineage(chosen, replayed)
        plan: list[tuple[DeadLetter, int]] = []
        for letter in chosen:
            outcome, attempt = decide(
                letter,
                sent=sent,
                prior_attempts=attempts,
                max_attempts=options.max_attempts,
                force=options.force,
            )
            report.outcomes[outcome] += 1
            if outcome == EXHAUSTED:
                report.exhausted.append(letter.replay_id)
            elif outcome == SEND:
                plan.append((letter, attempt))
        if export is not None:
            for letter in chosen:
                export.write(export_line(letter, attempts.get(letter.origin, 0)) + "\n")
                report.exported += 1
        if not (options.dry_run or export is not None):
            _send(kafka, settings, options, report, plan, clock=clock, sleep=sleep)
    finally:
        kafka.close()
        report.elapsed_s = clock() - started
    return report


def _send(
    kafka: _Kafka,
    settings: Settings,
    options: ReplayOptions,
    report: ReplayReport,
    plan: list[tuple[DeadLetter, int]],
    *,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> None:
    """Step 4: produce, and commit only what the broker acknowledged."""
    destination = {letter.replay_id: options.to_topic or letter.origin[0] for letter, _ in plan}
    missing = sorted(set(destination.values()) - set(kafka.topics))
    if missing:
        raise ConfigurationError(
            f"destination topic(s) {', '.join(missing)} do not exist; create them or use --to"
        )
    tracker = CommitTracker(report.ranges, ((d.partition, d.offset) for d, _ in plan))
    errors: list[str] = []

    def delivered(partition: int, offset: int, err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
            return
        tracker.acked(partition, offset)
        report.acked += 1

    producer = Producer(
        {
            **kafka.conf,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "partitioner": "murmur2_random",  # the Java client's: same key, same partition
            "message.timeout.ms": 30000,
        }
    )
    bucket = TokenBucket(options.rate, clock=clock, sleep=sleep) if options.rate > 0 else None
    bar = tqdm(
        total=len(plan),
        desc="replaying",
        unit=" rec",
        file=sys.stderr,
        disable=None if options.progress else True,
    )
    send_started = last_commit = clock()
    try:
        for letter, attempt in plan:  # in dead-letter offset order: the commit point advances
            if bucket is not None:
                bucket.acquire()
            headers: list[tuple[str, str | bytes | None]] = [
                (ID_HEADER, letter.replay_id.encode()),
                (ATTEMPT_HEADER, str(attempt).encode()),
            ]
            callback = functools.partial(delivered, letter.partition, letter.offset)
            while True:
                try:
                    producer.produce(
                        destination[letter.replay_id],
                        key=letter.record.get("key"),
                        value=letter.record.get("value"),
                        headers=headers,
                        on_delivery=callback,
                    )
                    break
                except BufferError:  # local queue full: wait for acknowledgements
                    producer.poll(0.1)
            report.sent += 1
            producer.poll(0)
            bar.update(1)
            bar.set_postfix(acked=report.acked, failed=len(errors), refresh=False)
            if clock() - last_commit >= 2.0:
                kafka.commit(report.dlq_topic, tracker.safe())
                last_commit = clock()
        remaining = producer.flush(60.0)
        report.send_s = clock() - send_started
    finally:
        bar.close()
    report.committed = tracker.safe()
    kafka.commit(report.dlq_topic, report.committed)
    if remaining or errors:
        raise PublishError(
            f"{remaining + len(errors)} replayed record(s) not acknowledged"
            + (f" ({errors[0]})" if errors else "")
            + "; the group's offsets stop before the first of them: run again to resend"
        )
