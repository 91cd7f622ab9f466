"""Holes in a lane partition that are real: transaction markers and aborted records
(issue 15, behaviour 9; issue 30).

A real broker and a real worker process (the ``noop`` model). Requests are
produced to a one-partition lane in small Kafka transactions: each commit or
abort writes a control marker, an offset no consumer ever sees, and under
``read_committed`` (the worker's default) an aborted transaction's records are
never handed over either. The worker's consumer notes the offsets its fetch walked
past without a record (``faust_edge.PassedOffsets``), so the reader
(pipeline/worker/lane_reader.py, continuity.py) passes such a hole at once: no
seek back, nothing logged above DEBUG, the offsets counted in
``pipeline_lane_offsets_passed_total{how="log"}`` and handed to Faust's commit
(``faust_edge.add_gap``, or ``pass_end`` for markers that end the partition).

Checked here, for records produced before the worker starts and while it runs,
under each isolation level: every committed input answered exactly once (the
ledger); aborted ones never (``read_committed``) or once each
(``read_uncommitted``); the group's committed offset at the log end after each
phase, trailing markers included (lag 0); no line about the holes in the worker's
log (no seek back, no gap accepted); and a clean stop on SIGTERM (the harness fails
a worker that needs SIGKILL).

Two transactions that overlap put their markers side by side: a hole of two
offsets. That one is needed: Faust's commit passes over a hole of one offset
right after its committed offset by itself (``Consumer._new_offset`` only
holds back when ``min(acked) - committed > 1``), so with single markers alone
the test passed even with ``add_gap`` made a no-op; with the two-offset hole
the commit stops before it and the test fails.

A second test joins a second worker while the first holds records in its lane
buffer (a lane with room for few inputs in flight): the revoke drops them
(their offsets stay uncommitted) and they are read again by the partitions'
next owners; the ledger still finds an answer for every input, and the inputs
answered before the revoke are committed at it: repeats are no more than the
inputs in flight at the revoke.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from confluent_kafka import Producer
from harness import Deployment
from ledger import Kill, Ledger, answered_past_commit, check_ledger, committed, log_end
from support.scrape import counter_by

from pipeline.codecs.keys import content_hash
from pipeline.kafka.client import RequestProducer, request_bytes
from pipeline.kafka.security import client_config
from pipeline.settings import LANES, Settings
from pipeline.tools.supervise import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(600)]

SKIPPED = re.compile(
    r"(\S+)\[(\d+)\]: records (\d+)\.\.(\d+) were skipped by the consumer; reading them again"
)
AT_END = re.compile(
    r"(\S+)\[(\d+)\]: the consumer is at (\d+), past the last record read; reading from (\d+)"
)
ACCEPTED = re.compile(r"(\S+)\[(\d+)\]: offsets (\d+)\.\.(\d+) do not exist \(accepted as a gap\)")
DROPPED = re.compile(r"rebalance: (\d+) buffered lane records dropped \(read again after it\)")


def _wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.5)


class Transactions:
    """A transactional producer to partition 0 of one lane; notes each record's offset."""

    def __init__(self, settings: Settings, lane: str, name: str) -> None:
        self.settings = settings
        self.topic = settings.topics.lane_topic(lane)
        self.offsets: dict[str, int] = {}  # request_id -> offset
        self.errors: list[str] = []
        self._producer = Producer(
            {
                **client_config(settings),
                "transactional.id": f"{settings.topics.prefix}{name}",
                "acks": "all",
                "linger.ms": 5,
            }
        )
        self._producer.init_transactions(60)

    def _delivered(self, rid: str) -> Callable[[object, object], None]:
        def on_delivery(err: object, msg: object) -> None:  # never raises: librdkafka's thread
            if err is None:
                self.offsets[rid] = msg.offset()  # type: ignore[attr-defined]
            else:
                self.errors.append(f"{rid}: {err}")

        return on_delivery

    def begin(self, request_ids: list[str]) -> None:
        """Open a transaction of one request per id, its records written (a
        read_uncommitted consumer sees them before the transaction ends, a
        read_committed one once it is committed)."""
        self._producer.begin_transaction()
        for rid in request_ids:
            text = f"transactional request {rid}"
            _, value = request_bytes(text, request_id=rid, source="test_offset_holes")
            key = content_hash(text, self.settings.model.model_id).encode("ascii")
            self._producer.produce(
                self.topic, value=value, key=key, partition=0, on_delivery=self._delivered(rid)
            )
        assert self._producer.flush(30) == 0
        assert not self.errors, self.errors
        assert all(rid in self.offsets for rid in request_ids)

    def end(self, *, commit: bool) -> None:
        """Commit or abort the open transaction: its marker takes the next offset."""
        if commit:
            self._producer.commit_transaction(30)
        else:
            self._producer.abort_transaction(30)

    def close(self) -> None:
        """Destroy the client here, in the test's thread (librdkafka aborts the process
        when a client is destroyed from one of its own threads: see ledger.py)."""
        self._producer.flush(10)
        del self._producer


def _plain(settings: Settings, rid: str) -> None:
    """One request outside any transaction, so the last marker has a record after it."""
    with RequestProducer(settings) as producer:
        producer.send(f"plain request {rid}", lane="bulk", request_id=rid)


def _lane_committed(dep: Deployment, topic: str) -> int:
    done = committed(dep.settings.kafka.bootstrap_servers, dep.settings.worker.app_id, [topic])
    return done[(topic, 0)]


def _lane_end(dep: Deployment, topic: str) -> int:
    return log_end(dep.settings.kafka.bootstrap_servers, [topic])[(topic, 0)]


def _wait_committed_to_end(dep: Deployment, topic: str, timeout_s: float, what: str) -> int:
    """Wait until the group has committed partition 0 of ``topic`` up to its log end
    (read now); return that end."""
    end = _lane_end(dep, topic)
    try:
        _wait_for(lambda: _lane_committed(dep, topic) >= end, timeout_s, what)
    except TimeoutError:
        raise AssertionError(
            f"{what}: committed {_lane_committed(dep, topic)}, log end {end}"
        ) from None
    return end


def _phase(one: Transactions, two: Transactions, tag: str) -> list[str]:
    """An aborted transaction of 3 requests (one marker), two committed transactions of
    2 that overlap (their markers side by side: a hole of two offsets, which Faust's
    commit does not pass over by itself), then a plain request (so the last marker
    has a record after it); return the aborted request ids."""
    aborted = [f"{tag}-a-{i}" for i in range(3)]
    one.begin(aborted)
    one.end(commit=False)
    one.begin([f"{tag}-one-{i}" for i in range(2)])
    two.begin([f"{tag}-two-{i}" for i in range(2)])
    one.end(commit=True)
    two.end(commit=True)
    _plain(one.settings, f"{tag}-plain")
    return aborted


def _holes(offsets: list[int]) -> list[tuple[int, int]]:
    """Runs of consecutive ``offsets``, as (first, last)."""
    runs: list[tuple[int, int]] = []
    for o in sorted(offsets):
        if runs and runs[-1][1] == o - 1:
            runs[-1] = (runs[-1][0], o)
        else:
            runs.append((o, o))
    return runs


def _passed(port: int) -> dict[str, float]:
    """The worker's ``pipeline_lane_offsets_passed_total`` by ``how``."""
    return counter_by(port, "pipeline_lane_offsets_passed_total", "how")


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_transactions_aborted_committed_and_trailing_markers_pass_quietly(
    kafka_bootstrap: str, tmp_path: Path, isolation: str
) -> None:
    dep = Deployment.create(
        kafka_bootstrap,
        tmp_path,
        partitions=1,
        PIPELINE_MODEL_TASK="noop",
        PIPELINE_METRICS_SAMPLE_INTERVAL_S="60",
        PIPELINE_KAFKA_ISOLATION_LEVEL=isolation,
    )
    topic = dep.settings.topics.lane_topic("bulk")
    port = free_port()
    one, two = Transactions(dep.settings, "bulk", "one"), Transactions(dep.settings, "bulk", "two")
    # Produced before the worker starts: the first fetch holds records past each marker.
    aborted = _phase(one, two, "before")
    with (
        contextlib.closing(one),
        contextlib.closing(two),
        dep.worker(PIPELINE_METRICS_PORT=str(port)) as worker,
    ):
        _wait_committed_to_end(dep, topic, 60, "before: commit at log end")
        # Produced while the worker runs: each marker lands after its records were read.
        aborted += _phase(one, two, "running")
        _wait_committed_to_end(dep, topic, 60, "running: commit at log end")
        # Two overlapping transactions last: their markers end the partition, and no
        # record follows to show the hole; the consumer's position does.
        one.begin(["trailing-one"])
        two.begin(["trailing-two"])
        one.end(commit=True)
        two.end(commit=True)
        end = _wait_committed_to_end(dep, topic, 60, "trailing markers: commit at log end")
        assert _lane_committed(dep, topic) == end  # lag 0: the markers reached the commit

        ledger = Ledger(dep.settings)
        ledger.read(time.monotonic() + 60)
        aborted_results = {rid: len(ledger.results.pop(rid, [])) for rid in aborted}
        answered = 1 if isolation == "read_uncommitted" else 0
        assert aborted_results == dict.fromkeys(aborted, answered)
        assert ledger.missing() == []
        assert ledger.duplicates() == 0
        ledger.check_repeats(atol=1e-4)
        assert len(ledger.inputs) == 2 * (2 + 2 + 1) + 2
        passed = _passed(port)
        log = worker.log()

    # Every offset no committed record was produced at is a marker or an aborted record.
    committed_records = {o for _t, _p, o in ledger.inputs}
    aborted_records = {one.offsets[rid] for rid in aborted}
    markers = sorted(set(range(end)) - committed_records - aborted_records)
    assert len(markers) == 2 * 3 + 2, (markers, sorted(committed_records))
    assert [high - low for low, high in _holes(markers)][-1] == 1  # the trailing pair
    # No record stood behind any of them: each was passed at once, counted, not logged.
    without_record = len(markers) + (len(aborted) if isolation == "read_committed" else 0)
    assert passed == {"log": without_record, "seeks": 0}, passed
    for pattern in (SKIPPED, AT_END, ACCEPTED):
        assert not pattern.search(log), (pattern.pattern, log[-4000:])
    loud = re.findall(r"^.*\[(?:WARNING|ERROR|CRITICAL)\] pipeline\.worker.*$", log, re.M)
    assert loud == [], loud


REVOKING = re.compile(
    r"^\[([0-9-]+ [0-9:,]+)\] .* Revoking previously assigned partitions frozenset", re.M
)


class CommitSampler:
    """The group's committed offsets of ``topics``, read every 0.2 s in a thread."""

    def __init__(self, settings: Settings, topics: list[str]) -> None:
        self._args = (settings.kafka.bootstrap_servers, settings.worker.app_id, topics)
        self.samples: list[tuple[float, dict[tuple[str, int], int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a slow read is skipped, not fatal
                offsets = committed(*self._args, timeout_s=5.0)
                # Stamped when the answer came: it may hold commits made while the read
                # was under way, never later ones.
                self.samples.append((time.time(), offsets))
            self._stop.wait(0.2)

    def __enter__(self) -> CommitSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def last_before(self, at: float) -> dict[tuple[str, int], int]:
        """The last offsets read before ``at`` (wall clock, seconds)."""
        earlier = [offsets for when, offsets in self.samples if when < at]
        assert earlier, "no committed offsets were read before the revoke"
        return earlier[-1]


#: Faust's group timeouts, short: the second worker's join revokes within seconds.
FAST_GROUP = {"BROKER_SESSION_TIMEOUT": "6", "BROKER_HEARTBEAT_INTERVAL": "1"}
#: The first worker's periodic commit, rare: before its revoke it has answered much
#: that only the commit at the revoke can cover.
RARE_COMMITS = {"BROKER_COMMIT_INTERVAL": "30"}
#: One input in flight per lane: at most one partition has an answer acked during the
#: revoke's wait; Faust's own commit there would otherwise cover that partition's
#: earlier acks and hide a lost commit.
MAX_INFLIGHT = 1


def test_a_revoke_commits_what_was_answered_and_the_next_owner_reads_the_rest(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A lane with room for MAX_INFLIGHT inputs keeps the rest of each fetch in the lane
    buffer; a second worker joins; the first drops what it buffered (the revoke must
    not wait for them) and the partitions' owners after the rebalance read those
    offsets again. What the first worker answered before the revoke is committed at
    the revoke (faust_edge: Faust's revoke dropped those acks before its own commit),
    so the next owners repeat at most the inputs in flight at the revoke.
    (The runtime's own queue at a revoke is test_rebalance_give_up.py's.)"""
    requests = 3000
    dep = Deployment.create(
        kafka_bootstrap,
        tmp_path,
        partitions=2,
        PIPELINE_MODEL_TASK="noop",
        PIPELINE_BATCH_MAX_INFLIGHT=str(MAX_INFLIGHT),
        PIPELINE_DEDUPE_ENABLED="false",
        PIPELINE_METRICS_SAMPLE_INTERVAL_S="60",
    )
    lanes = [dep.settings.topics.lane_topic(lane) for lane in LANES]
    with dep.worker("worker-0", **FAST_GROUP, **RARE_COMMITS) as first:
        with RequestProducer(dep.settings) as producer:
            for i in range(requests):
                producer.send(f"buffered request {i}", lane="bulk", request_id=f"b-{i}")
        assert len(dep.answers(expect=5, timeout_s=60)) == 5  # the backlog is being served
        with CommitSampler(dep.settings, lanes) as sampler, dep.worker("worker-1", **FAST_GROUP):
            _wait_for(lambda: bool(DROPPED.search(first.log())), 120, "no buffered records dropped")
            summary = check_ledger(
                dep.settings, max_duplicates=requests, expect_inputs=requests, timeout_s=180
            )
            revoke = REVOKING.search(first.log())
            assert revoke is not None
            began = datetime.strptime(revoke[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            # Answered before the revoke began and not committed then: what a revoke
            # that commits nothing would have the next owners answer again.
            exposed = answered_past_commit(
                dep.settings, [Kill(int(began * 1000), sampler.last_before(began))]
            )
        match = DROPPED.search(first.log())
        assert match is not None and int(match[1]) > 0
    print(summary, f"dropped at the revoke: {match[1]}; answered past the commit: {exposed}")
    assert summary["missing"] == 0
    assert exposed > MAX_INFLIGHT, exposed  # else this run could not tell a lost commit
    assert summary["duplicates"] <= MAX_INFLIGHT, (summary, exposed)
