"""Dead-letter replay: read the dead-letter topic, select, send the inputs through again.

A run always terminates, and is safe to repeat:

1. read the dead-letter topic's end offsets (high watermarks) first: the range
   ends there, whatever arrives meanwhile;
2. read ``[start, end)`` of every partition, decode, filter: the selection; a
   dead letter that holds only a prefix of its input's value (``value_length``
   set) gets the whole value re-read from the original topic at its
   coordinates, checked against ``value_sha256``; one whose input the topic no
   longer holds is reported as gone and not sent;
3. scan the destination topics, from the oldest selected input's timestamp, for
   records with a ``pipeline-replay-id`` header: what was already sent, and how
   many times each replayed record had been replayed (its lineage);
4. send each selected input's key and value, untouched, with the two headers,
   at most ``rate`` a second; commit the group's offsets only for records the
   broker acknowledged (idempotent producer, ``acks=all``), in offset order.

The pure parts (time parsing, filters, range planning, decisions, the summary,
the token bucket, the commit tracker) live in ``plan`` and need no broker; the
consumer that reads bounded ranges lives in ``kafka``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from confluent_kafka import KafkaError, Producer
from tqdm import tqdm

from pipeline.codecs.avro import dead_letter_codec
from pipeline.codecs.registry import writer_lookup
from pipeline.errors import ConfigurationError, PermanentError, PublishError
from pipeline.kafka.producer import BROKER_MAX_MESSAGE_BYTES
from pipeline.settings import Settings
from pipeline.tools.replay.kafka import ReplayKafka, headers_of, position_of
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
    plan_ranges,
    summarize,
)

__all__ = ["SCAN_MARGIN_MS", "ReplayOptions", "ReplayReport", "replay"]

#: The destination scan starts this long before the oldest selected input,
#: for producers whose clocks run behind the broker's.
SCAN_MARGIN_MS = 5 * 60 * 1000


@dataclass(frozen=True)
class ReplayOptions:
    """What one ``replay`` run does (see the CLI's ``replay-dlq`` for each one's meaning)."""

    start: Start = field(default_factory=Start)
    filters: Filters = field(default_factory=Filters)
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
    refetched: int = 0
    gone: list[str] = field(default_factory=list)
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
            f"over max attempts {self.outcomes[EXHAUSTED]}"
            + (f", input gone from its topic {len(self.gone)}" if self.gone else "")
            + f"; {self.elapsed_s:.1f} s"
        )


def _select(
    kafka: ReplayKafka,
    dlq: str,
    options: ReplayOptions,
    report: ReplayReport,
    writer_of: Callable[[int], Any] | None = None,
) -> list[DeadLetter]:
    """Steps 1 and 2: end offsets first, then read, decode (registry-framed dead letters
    with ``writer_of``) and filter."""
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
            record = codec.decode_any(msg.value(), writer_of)
        except PermanentError:
            report.undecodable += 1
            continue
        if options.filters.matches(record):
            _topic, partition, offset = position_of(msg)
            chosen.append(DeadLetter(dlq, partition, offset, record))
    return chosen


def _whole(kafka: ReplayKafka, chosen: list[DeadLetter], report: ReplayReport) -> list[DeadLetter]:
    """Step 2's end: put back the whole value of every dead letter that holds only a
    prefix of it, re-read from the original topic; leave out (as gone) those whose
    input the topic no longer holds, or holds with other bytes."""
    out: list[DeadLetter] = []
    for letter in chosen:
        length, digest = letter.record.get("value_length"), letter.record.get("value_sha256")
        if length is None:
            out.append(letter)
            continue
        msg = kafka.record_at(*letter.origin)
        value = None if msg is None else msg.value()
        if msg is None or value is None or len(value) != length:
            report.gone.append(letter.replay_id)
            continue
        if hashlib.sha256(value).hexdigest() != digest:  # the topic was recreated
            report.gone.append(letter.replay_id)
            continue
        record = {**letter.record, "key": msg.key(), "value": value}
        record.update(value_length=None, value_sha256=None, key_length=None)
        out.append(dataclasses.replace(letter, record=record))
        report.refetched += 1
    return out


def _scan(
    kafka: ReplayKafka, topics: set[str], since_ms: int, report: ReplayReport, progress: bool
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
        headers = headers_of(msg)
        rid = headers.get(ID_HEADER)
        if rid is None:
            continue
        sent[rid.decode(errors="replace")] += 1
        try:
            attempt = int(headers.get(ATTEMPT_HEADER, b"1"))
        except ValueError:
            attempt = 1
        attempts[position_of(msg)] = (attempt, _digest(msg.key(), msg.value()))
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
    kafka = ReplayKafka(settings, group=options.group, connect_timeout_s=options.connect_timeout_s)
    try:
        kafka.require(dlq, "dead-letter")
        if options.to_topic:
            kafka.require(options.to_topic, "destination (--to)")
        writer_of = writer_lookup(settings.registry)
        chosen = _whole(kafka, _select(kafka, dlq, options, report, writer_of), report)
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
    kafka: ReplayKafka,
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
            # An input re-read whole may be as large as the broker accepted it.
            "message.max.bytes": BROKER_MAX_MESSAGE_BYTES,
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
