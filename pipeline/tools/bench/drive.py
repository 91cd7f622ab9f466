"""Traffic on the real broker: send a workload, collect its answers, and the floor loop.

:class:`Collector` reads the results and dead-letter topics of one topic
prefix on its own thread from the beginning (assigned partitions, no group
rebalance), stamping each answer with its receipt time. :func:`send` plays a
workload open-loop (or as fast as possible). :func:`floor_loop` is the
reference: a plain confluent-kafka consume-and-produce loop in Python.
:class:`FloorCounter` counts the faust-floor mode's answers (raw copies of
the requests, so they carry no request id).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from pipeline.codecs.avro import dead_letter_codec, result_codec
from pipeline.errors import DecodeError
from pipeline.kafka.client import RequestProducer, request_bytes
from pipeline.kafka.security import client_config
from pipeline.observability.logs import librdkafka_log
from pipeline.settings import LANES, Settings
from pipeline.tools.bench.stats import Answered
from pipeline.tools.bench.workload import BenchRequest

__all__ = ["Collector", "FloorCounter", "floor_loop", "send", "wall_ms"]


def wall_ms() -> float:
    return time.time() * 1000.0


class Collector:
    """Answers of one deployment, by request_id (the first one seen wins)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.answers: dict[str, Answered] = {}
        self.sent: dict[str, tuple[str, float]] = {}  # rid -> (lane, send time), for dead letters
        self.repeats: list[tuple[str, float]] = []  # (rid, receipt ms): answers after the first
        self._lock = threading.Lock()
        self._stop = threading.Event()
        topics = settings.topics
        self._lane_of = {topics.lane_topic(lane): lane for lane in LANES}
        self._consumer = Consumer(
            {
                **client_config(settings),
                **librdkafka_log(),  # a broker restart (the soak's) refuses connections
                "group.id": f"pipeline-bench-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
        )
        self._consumer.assign(
            [
                TopicPartition(topic, p, OFFSET_BEGINNING)
                for topic in (topics.results_topic, topics.dlq_topic)
                for p in range(topics.partitions)
            ]
        )
        self._thread = threading.Thread(target=self._run, name="bench-collector", daemon=True)
        self._thread.start()

    def count(self, prefix: str) -> int:
        with self._lock:
            return sum(1 for rid in self.answers if rid.startswith(prefix))

    def of(self, prefix: str) -> list[Answered]:
        with self._lock:
            return [a for rid, a in self.answers.items() if rid.startswith(prefix)]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()

    def _run(self) -> None:
        results_topic = self.settings.topics.results_topic
        rcodec, dcodec = result_codec(), dead_letter_codec()
        while not self._stop.is_set():
            # poll() returns as soon as one answer is there; consume(n, timeout) would
            # wait for n of them or the timeout, adding up to that much to latency.
            first = self._consumer.poll(0.1)
            batch = [] if first is None else [first, *self._consumer.consume(500, 0)]
            for msg in batch:
                now = wall_ms()
                if msg.error() is not None:  # end of partition, topic not there yet
                    continue
                answer: Answered | None
                try:
                    if msg.topic() == results_topic:
                        # The embedding as its bytes, unread (the compiled reader): as
                        # floats, fastavro took ~39 µs an answer of 384 of them, CPU the
                        # bench took from the host it measures (noop answers 4 floats).
                        answer = self._result(rcodec.decode(msg.value(), floats_as_bytes=True), now)
                    else:
                        answer = self._dead(dcodec.decode(msg.value()), now)
                except DecodeError:
                    continue
                if answer is None:
                    continue
                with self._lock:
                    if answer.request_id in self.answers:
                        self.repeats.append((answer.request_id, now))
                    else:
                        self.answers[answer.request_id] = answer

    @staticmethod
    def _result(r: dict[str, Any], now: float) -> Answered:
        return Answered(
            request_id=r["request_id"],
            lane=r["priority"],
            kind="result",
            created_at_ms=int(r["created_at_ms"]),
            received_ms=now,
            completed_at_ms=int(r["completed_at_ms"]),
            served=r["served"],
            queue_ms=r.get("queue_ms"),
            inference_ms=r.get("inference_ms"),
        )

    def _dead(self, r: dict[str, Any], now: float) -> Answered | None:
        rid = r.get("request_id")
        if not rid:
            return None
        lane, sent_ms = self.sent.get(rid, (self._lane_of.get(r["original_topic"], "?"), now))
        return Answered(
            request_id=rid,
            lane=lane,
            kind="dead_letter",
            created_at_ms=int(sent_ms),
            received_ms=now,
            stage=r["stage"],
            failed_at_ms=r.get("failed_at_ms"),
        )


class _SendLog(Protocol):
    sent: dict[str, tuple[str, float]]


class FloorCounter:
    """Counts records reaching the results topic, on its own thread; ``sent``
    is there for :func:`pipeline.tools.bench.drive.send`, which records each send."""

    def __init__(self, settings: Settings) -> None:
        self.sent: dict[str, tuple[str, float]] = {}
        self.count = 0
        self.last_ms = 0.0
        self._stop = threading.Event()
        topics = settings.topics
        self._consumer = Consumer(
            {
                **client_config(settings),
                **librdkafka_log(),  # a broker restart (the soak's) refuses connections
                "group.id": f"pipeline-bench-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
        )
        self._consumer.assign(
            [TopicPartition(topics.results_topic, p, OFFSET_BEGINNING)
             for p in range(topics.partitions)]
        )  # fmt: skip
        self._thread = threading.Thread(target=self._run, name="floor-counter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            msgs = self._consumer.consume(1000, 0.1)
            got = sum(1 for m in msgs if m.error() is None)
            if got:
                self.count += got
                self.last_ms = time.time() * 1000.0

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def send(
    producer: RequestProducer,
    workload: Sequence[BenchRequest],
    *,
    prefix: str,
    collector: _SendLog,
    progress: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
) -> float:
    """Send ``workload`` at its offsets (open loop; all at once when they are 0),
    up to the end or until ``stop`` is set (then nothing more is sent, waits included).

    Request ids are ``prefix + index``; each one sent is in ``collector.sent``.
    Returns the wall time (ms) of the first send.
    """
    start = wall_ms()
    t0 = time.monotonic()
    stop = stop or threading.Event()
    for req in workload:
        delay = req.offset_ms / 1000.0 - (time.monotonic() - t0)
        if stop.wait(delay) if delay > 0 else stop.is_set():
            break
        rid = f"{prefix}{req.index}"
        collector.sent[rid] = (req.lane, wall_ms())
        producer.send(req.text, lane=req.lane, request_id=rid)
        if progress is not None:
            progress(1)
    producer.flush()
    return start


def floor_loop(settings: Settings, texts: Sequence[str], *, timeout_s: float = 300.0) -> float:
    """Preload ``texts`` as requests on the standard lane, then consume and produce
    each one unchanged to the results topic; return events per second of that loop
    (first poll to the last acknowledgement)."""
    topics = settings.topics
    lane_topic = topics.lane_topic("standard")
    with RequestProducer(settings, source="pipeline bench") as producer:
        for text in texts:
            producer.send_raw("standard", None, request_bytes(text)[1])
    consumer = Consumer(
        {
            **client_config(settings),
            "group.id": f"pipeline-bench-floor-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign(
        [TopicPartition(lane_topic, p, OFFSET_BEGINNING) for p in range(topics.partitions)]
    )
    out = Producer({**client_config(settings), "acks": "all", "linger.ms": 5})
    seen = 0
    start = time.monotonic()
    try:
        while seen < len(texts) and time.monotonic() - start < timeout_s:
            for msg in consumer.consume(500, 0.1):
                if msg.error() is not None:
                    continue
                while True:
                    try:
                        out.produce(topics.results_topic, value=msg.value(), key=msg.key())
                        break
                    except BufferError:
                        out.poll(0.05)
                out.poll(0)
                seen += 1
        out.flush(60)
    finally:
        consumer.close()
    return seen / max(time.monotonic() - start, 1e-6)
