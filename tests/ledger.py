"""The ledger: after a fault, every input still has its answer, and repeats are bounded.

Every fault test ends with :func:`check_ledger`. It reads the lane topics up to
their log end and the results and dead-letter topics, and checks the delivery
promises (README, "Guarantees"):

1. every input (topic, partition, offset) has at least one answer: a dead
   letter naming that origin, or a result carrying its request_id;
2. answers beyond the first per input (duplicates) number at most
   ``max_duplicates``, which the test sets from the inputs that were in
   flight (delivered but not committed) at its faults (:func:`in_flight`);
3. repeated results of one request agree: same request_id and content hash
   (the hash of the input's text), embeddings equal within ``atol``.

It returns a summary that tests print, for the issue notes.
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from pipeline.codecs.avro import dead_letter_codec, request_codec, result_codec
from pipeline.codecs.keys import content_hash
from pipeline.errors import DecodeError
from pipeline.settings import LANES, Settings

__all__ = [
    "Kill",
    "Ledger",
    "LedgerError",
    "LedgerTimeout",
    "after_kill",
    "answered_past_commit",
    "check_ledger",
    "committed",
    "in_flight",
    "log_end",
    "wait_caught_up",
]

Origin = tuple[str, int, int]


class LedgerError(AssertionError):
    """A delivery promise is broken; the message says which inputs and how."""


class LedgerTimeout(TimeoutError):
    """The broker did not answer a ledger query in time (it may be down)."""


def _consumer(bootstrap: str, group: str | None = None) -> Consumer:
    """A consumer that never joins a group: ``group`` only names whose commits to read."""
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group or f"ledger-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "log_level": 0,
        }
    )


@contextlib.contextmanager
def _client(bootstrap: str, group: str | None = None) -> Iterator[Consumer]:
    """One confluent client, used and closed by the thread that made it.

    librdkafka aborts the whole interpreter when a client is destroyed from a
    thread it owns, so nothing here is left to the garbage collector, and no
    AdminClient (which cannot be closed) is used.
    """
    consumer = _consumer(bootstrap, group)
    try:
        yield consumer
    finally:
        consumer.close()


def _ends(consumer: Consumer, topics: Iterable[str], deadline: float) -> dict[tuple[str, int], int]:
    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise LedgerTimeout("the broker did not answer in time")
        return min(remaining, 10.0)

    meta = consumer.list_topics(timeout=left()).topics
    out: dict[tuple[str, int], int] = {}
    for topic in topics:
        for partition in meta[topic].partitions:
            _low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=left()
            )
            out[(topic, partition)] = high
    return out


def _committed(
    consumer: Consumer, tps: Iterable[tuple[str, int]], deadline: float
) -> dict[tuple[str, int], int]:
    timeout = deadline - time.monotonic()
    if timeout <= 0:
        raise LedgerTimeout("the broker did not answer in time")
    found = consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=timeout)
    failed = [tp for tp in found if tp.error is not None]
    if failed:  # never read a partition the broker could not answer for as "nothing yet"
        raise LedgerTimeout(f"committed offsets not available: {failed[0].error}")
    return {(tp.topic, tp.partition): max(0, tp.offset) for tp in found}


def log_end(
    bootstrap: str, topics: Iterable[str], timeout_s: float = 30.0
) -> dict[tuple[str, int], int]:
    """The log-end offset (high watermark) of every partition of ``topics``."""
    with _client(bootstrap) as consumer:
        return _ends(consumer, topics, time.monotonic() + timeout_s)


def committed(
    bootstrap: str, group: str, topics: Iterable[str], timeout_s: float = 30.0
) -> dict[tuple[str, int], int]:
    """The consumer group's committed offset per partition (0 where none is committed)."""
    deadline = time.monotonic() + timeout_s
    with _client(bootstrap, group) as consumer:
        return _committed(consumer, _ends(consumer, topics, deadline), deadline)


def in_flight(settings: Settings, timeout_s: float = 30.0) -> int:
    """Inputs past the group's committed offsets: what a fault now may answer twice.

    The commits are read before the log ends, so the figure is never below the
    inputs in flight at any instant between the two reads.
    """
    lanes = [settings.topics.lane_topic(lane) for lane in LANES]
    deadline = time.monotonic() + timeout_s
    with _client(settings.kafka.bootstrap_servers, settings.worker.app_id) as consumer:
        tps = [(t, p) for t in lanes for p in range(settings.topics.partitions)]
        done = _committed(consumer, tps, deadline)
        ends = _ends(consumer, lanes, deadline)
    return sum(max(0, end - done.get(tp, 0)) for tp, end in ends.items())


def _close(a: list[float] | None, b: list[float] | None, atol: float) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(
        math.isclose(x, y, abs_tol=atol) for x, y in zip(a, b, strict=True)
    )


@dataclass(frozen=True)
class Kill:
    """A worker killed: when (wall clock, ms, as the worker stamps its answers) and
    what its group had committed then."""

    at_ms: int
    offsets: dict[tuple[str, int], int]


def after_kill(settings: Settings) -> Kill:
    """Call once a killed worker has exited, before another one starts: the group's
    committed offsets now are where the next worker starts reading again.

    Nothing is waited for. A commit the dead worker sent just before it died may
    land after this read; then the count of :func:`answered_past_commit` includes
    inputs that will not be delivered again: looser, never short.
    """
    at_ms = int(time.time() * 1000)
    lanes = [settings.topics.lane_topic(lane) for lane in LANES]
    done = committed(settings.kafka.bootstrap_servers, settings.worker.app_id, lanes)
    return Kill(at_ms=at_ms, offsets=done)


def answered_past_commit(settings: Settings, kills: Iterable[Kill]) -> int:
    """Inputs each killed worker answered but its group had not committed, summed over
    ``kills``: after a kill, exactly these may be answered once more.

    An answer counts when it was made before the kill (a result's ``completed_at_ms``,
    a dead letter's ``failed_at_ms``), wherever it sits in the topics; so a dead
    worker's last answers, which the broker may append after the worker is gone
    (they were in its sockets), count however late they land, and no later worker's
    answer counts. Call it after the last kill, once a worker has run again (the
    dead workers' answers are on the topics by then).
    """
    ledger = Ledger(settings)
    ledger.read(time.monotonic() + 60)
    return sum(ledger.answered_past(k.offsets, before_ms=k.at_ms) for k in kills)


def wait_caught_up(settings: Settings, timeout_s: float = 120.0) -> None:
    """Return once the worker's group has committed every lane partition up to its log
    end as read when the first input sent after the call had arrived (so a producer
    must be sending): a worker is in the group and serving again, and every input
    sent before is answered and its offset released. Retries while the broker does
    not answer (just after a restart, say); :class:`LedgerError` after ``timeout_s``."""
    bootstrap, group = settings.kafka.bootstrap_servers, settings.worker.app_id
    lanes = [settings.topics.lane_topic(lane) for lane in LANES]
    deadline = time.monotonic() + timeout_s
    first: dict[tuple[str, int], int] | None = None
    upto: dict[tuple[str, int], int] | None = None
    behind: object = "the broker did not answer"
    while True:
        try:
            if upto is None:
                ends = log_end(bootstrap, lanes, timeout_s=5.0)
                if first is None:
                    first = ends
                elif any(end > first.get(tp, 0) for tp, end in ends.items()):
                    upto = ends
            if upto is None:
                behind = "no input arrived since the call"
            else:
                done = committed(bootstrap, group, lanes, timeout_s=5.0)
                behind = {
                    tp: (done.get(tp, 0), end) for tp, end in upto.items() if done.get(tp, 0) < end
                }
                if not behind:
                    return
        except (LedgerTimeout, KafkaException) as exc:  # the broker is not back yet
            behind = repr(exc)
        if time.monotonic() >= deadline:
            raise LedgerError(f"the group did not catch up in {timeout_s:.0f}s: {behind}")
        time.sleep(0.5)  # the poll's interval


def _read(
    consumer: Consumer,
    ends: dict[tuple[str, int], int],
    positions: dict[tuple[str, int], int],
    deadline: float,
) -> list[Any]:
    """Messages from ``positions`` up to ``ends`` (exclusive), or until ``deadline``."""
    todo = {tp for tp, end in ends.items() if positions.get(tp, 0) < end}
    if not todo:
        return []
    consumer.assign(
        [
            TopicPartition(t, p, positions.get((t, p), OFFSET_BEGINNING) or OFFSET_BEGINNING)
            for t, p in todo
        ]
    )
    out = []
    while todo and time.monotonic() < deadline:
        for msg in consumer.consume(500, timeout=0.5):
            if msg.error() is not None:
                continue
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            assert topic is not None and partition is not None and offset is not None
            tp = (topic, partition)
            out.append(msg)
            positions[tp] = offset + 1
            if positions[tp] >= ends[tp]:
                todo.discard(tp)
    consumer.unassign()
    return out


@dataclass
class Ledger:
    """What the lane, results and dead-letter topics hold, and how they match up."""

    settings: Settings
    inputs: dict[Origin, dict[str, Any] | None] = field(default_factory=dict)
    results: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    letters: Counter[Origin] = field(default_factory=Counter)
    letter_times: dict[Origin, list[int]] = field(default_factory=lambda: defaultdict(list))
    n_results: int = 0
    n_letters: int = 0
    _positions: dict[tuple[str, int], int] = field(default_factory=dict)

    def read(self, deadline: float) -> None:
        """Read every topic from where the last read stopped to its log end now."""
        s = self.settings
        bootstrap = s.kafka.bootstrap_servers
        lanes = [s.topics.lane_topic(lane) for lane in LANES]
        out = [s.topics.results_topic, s.topics.dlq_topic]
        with _client(bootstrap) as consumer:
            ends = _ends(consumer, lanes + out, deadline)
            for msg in _read(consumer, ends, self._positions, deadline):
                topic = msg.topic()
                if topic in lanes:
                    try:
                        record: dict[str, Any] | None = request_codec().decode(msg.value())
                    except DecodeError:
                        record = None
                    self.inputs[(topic, msg.partition(), msg.offset())] = record
                elif topic == s.topics.results_topic:
                    res = result_codec().decode(msg.value())
                    self.results[res["request_id"]].append(res)
                    self.n_results += 1
                else:
                    dl = dead_letter_codec().decode(msg.value())
                    origin = (dl["original_topic"], dl["original_partition"], dl["original_offset"])
                    self.letters[origin] += 1
                    self.letter_times[origin].append(dl["failed_at_ms"])
                    self.n_letters += 1

    def missing(self) -> list[Origin]:
        """Inputs without an answer yet."""
        by_rid: dict[str, list[Origin]] = defaultdict(list)
        lost = []
        for origin, record in self.inputs.items():
            if self.letters[origin]:
                continue
            rid = record["request_id"] if record is not None else None
            if rid is None:
                lost.append(origin)
            else:
                by_rid[rid].append(origin)
        for rid, origins in by_rid.items():
            # A request_id used by several inputs needs as many results.
            have = len(self.results.get(rid, ()))
            if have < len(origins):
                lost.extend(sorted(origins)[have:])
        return sorted(lost)

    def duplicates(self) -> int:
        """Answers beyond one per input."""
        rids = Counter(r["request_id"] for r in self.inputs.values() if r is not None)
        letters_by_rid: Counter[str] = Counter()
        for origin, n in self.letters.items():
            record = self.inputs.get(origin)
            if record is not None:
                letters_by_rid[record["request_id"]] += n
        answered_by_result = {
            rid: max(0, count - letters_by_rid[rid]) for rid, count in rids.items()
        }
        extra_results = sum(
            max(0, len(res) - answered_by_result.get(rid, 0)) for rid, res in self.results.items()
        )
        extra_letters = sum(n - 1 for n in self.letters.values() if n > 1)
        return extra_results + extra_letters

    def check_repeats(self, atol: float) -> None:
        """Repeated results of one request carry the same content."""
        model_id = self.settings.model.model_id
        texts: dict[str, set[str]] = defaultdict(set)
        for record in self.inputs.values():
            if record is not None:
                texts[record["request_id"]].add(record["text"])
        for rid, res in self.results.items():
            if rid not in texts:
                raise LedgerError(f"result for request_id {rid!r}, which no input carries")
            hashes = {content_hash(t, model_id) for t in texts[rid]}
            for r in res:
                if r["content_hash"] not in hashes:
                    raise LedgerError(f"{rid}: result for content {r['content_hash']} not sent")
            if len(texts[rid]) > 1 or len(res) < 2:
                continue
            first = res[0]["embedding"]
            for other in res[1:]:
                if not _close(first, other["embedding"], atol):
                    raise LedgerError(f"{rid}: repeated results differ in content")
                if other["label"] != res[0]["label"]:
                    raise LedgerError(f"{rid}: repeated results differ in label")

    def input_ends(self) -> dict[tuple[str, int], int]:
        """Per lane partition, one past the last input read."""
        ends: dict[tuple[str, int], int] = {}
        for topic, partition, offset in self.inputs:
            ends[(topic, partition)] = max(ends.get((topic, partition), 0), offset + 1)
        return ends

    def answered_past(self, offsets: dict[tuple[str, int], int], before_ms: int) -> int:
        """Inputs at or past ``offsets`` (committed) with an answer made by
        ``before_ms``: after a crash at that time, exactly these can be answered a
        second time (an input whose request_id others share counts when any result
        for that request_id was made by then: a count too high, never too low)."""
        first_result = {
            rid: min(r["completed_at_ms"] for r in res) for rid, res in self.results.items()
        }
        n = 0
        for origin, record in self.inputs.items():
            topic, partition, offset = origin
            if offset < offsets.get((topic, partition), 0):
                continue
            times = list(self.letter_times.get(origin, ()))
            if record is not None and record["request_id"] in first_result:
                times.append(first_result[record["request_id"]])
            if times and min(times) <= before_ms:
                n += 1
        return n

    def summary(self) -> dict[str, int]:
        return {
            "inputs": len(self.inputs),
            "undecodable_inputs": sum(1 for r in self.inputs.values() if r is None),
            "results": self.n_results,
            "dead_letters": self.n_letters,
            "duplicates": self.duplicates(),
            "missing": len(self.missing()),
        }


def _wait_committed(settings: Settings, upto: dict[tuple[str, int], int], deadline: float) -> None:
    """Return once the worker's group has committed each partition up to ``upto``;
    raise :class:`LedgerError` at ``deadline``."""
    lanes = sorted({t for t, _ in upto})
    while True:
        done = committed(settings.kafka.bootstrap_servers, settings.worker.app_id, lanes)
        behind = {tp: (done.get(tp, 0), end) for tp, end in upto.items() if done.get(tp, 0) < end}
        if not behind:
            return
        if time.monotonic() >= deadline:
            raise LedgerError(f"every input answered, but not committed (at, end): {behind}")
        time.sleep(0.5)  # the poll's interval


def check_ledger(
    settings: Settings,
    *,
    max_duplicates: int,
    timeout_s: float = 90.0,
    atol: float = 1e-4,
    expect_inputs: int | tuple[int, int] | None = None,
) -> dict[str, int]:
    """Wait until every input is answered (or ``timeout_s``) and then committed by the
    worker's group (so a worker must be running), then check the promises.

    Raises :class:`LedgerError` naming what is missing, duplicated past
    ``max_duplicates`` or inconsistent; returns :meth:`Ledger.summary` with
    ``max_duplicates`` added. ``expect_inputs``, when given, is the number of
    inputs the test knows it produced (the ledger must see exactly that many),
    or a range (low, high), both included.
    """
    ledger = Ledger(settings)
    deadline = time.monotonic() + timeout_s
    while True:
        # Each read runs to the log ends it found (bounded on its own), so a
        # slow read near the deadline never passes for a missing answer.
        ledger.read(time.monotonic() + 60)
        lost = ledger.missing()
        if not lost or time.monotonic() >= deadline:
            break
        time.sleep(1.0)  # the poll's interval (each read opens a client and reads anew)
    if not lost:
        # Late duplicates count too: once the group has committed past every input,
        # the worker is done with them (each answer is acknowledged before its
        # offset is released), so what it answered is on the topics now.
        _wait_committed(settings, ledger.input_ends(), time.monotonic() + 60)
        ledger.read(time.monotonic() + 60)
    summary = {**ledger.summary(), "max_duplicates": max_duplicates}
    if expect_inputs is not None:
        low, high = (
            expect_inputs if isinstance(expect_inputs, tuple) else (expect_inputs, expect_inputs)
        )
        if not low <= summary["inputs"] <= high:
            raise LedgerError(f"expected {expect_inputs} inputs on the lanes, found {summary}")
    lost = ledger.missing()
    if lost:
        per_partition = Counter((t, p) for t, p, _ in lost)
        # Lost for good when the group committed past them; otherwise stalled
        # (a restart would deliver them again).
        lanes = sorted({t for t, _, _ in lost})
        done = committed(settings.kafka.bootstrap_servers, settings.worker.app_id, lanes)
        past = [o for o in lost if o[2] < done.get((o[0], o[1]), 0)]
        raise LedgerError(
            f"{len(lost)} inputs never answered, e.g. {lost[:5]}; by partition "
            f"{dict(per_partition)}; committed past {len(past)} of them (offsets "
            f"{ {tp: done[tp] for tp in per_partition if tp in done} }); {summary}"
        )
    if summary["duplicates"] > max_duplicates:
        raise LedgerError(f"duplicates above the bound: {summary}")
    ledger.check_repeats(atol)
    return summary
