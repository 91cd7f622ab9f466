"""Dead-letter replay's broker side: one consumer that reads bounded ranges.

Every confluent-kafka error leaves this module as a pipeline error
(BrokerUnavailable, ConfigurationError), so ``run`` catches only the project's own.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from tqdm import tqdm

from pipeline.errors import BrokerUnavailable, ConfigurationError
from pipeline.kafka.security import AuthWatch, client_config, connect
from pipeline.settings import Settings

__all__ = ["ReplayKafka", "headers_of", "position_of"]


def headers_of(msg: Any) -> dict[str, bytes]:
    """A record's headers as ``{name: bytes}``; empty values left out."""
    return {k: v if isinstance(v, bytes) else v.encode() for k, v in (msg.headers() or []) if v}


def position_of(msg: Any) -> tuple[str, int, int]:
    """Where a record sits: ``(topic, partition, offset)``."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


class ReplayKafka:
    """The replay's clients; every confluent-kafka error leaves as a pipeline error."""

    def __init__(self, settings: Settings, *, group: str, connect_timeout_s: float) -> None:
        self.bootstrap = settings.kafka.bootstrap_servers
        self.timeout = connect_timeout_s
        self.watch = AuthWatch(settings)
        base = {**client_config(settings, self.watch), "log_level": 0}
        self.conf = {**base, "client.id": settings.kafka.client_id + "-replay"}
        self.consumer = Consumer(
            {
                **self.conf,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        try:
            self.topics: dict[str, int] = {
                name: len(meta.partitions)
                for name, meta in connect(self.consumer, self.watch, self.timeout).topics.items()
                if meta.error is None
            }
        except ConfigurationError:  # BrokerUnavailable, AuthenticationFailed
            self.consumer.close()
            raise

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
                    topic, partition, offset = position_of(msg)
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

    def record_at(self, topic: str, partition: int, offset: int) -> Any | None:
        """The record at ``offset`` of ``topic[partition]``, or None when the topic no
        longer holds it (retention or compaction removed it, or the topic is gone)."""
        if topic not in self.topics or partition >= self.topics[topic]:
            return None
        low, high = self.watermarks(topic)[partition]
        if not low <= offset < high:
            return None
        for msg in self.read({(topic, partition): (offset, offset + 1)}, desc="", progress=False):
            if position_of(msg)[2] == offset:
                return msg
        return None

    def commit(self, topic: str, offsets: Mapping[int, int]) -> None:
        tps = [TopicPartition(topic, p, off) for p, off in offsets.items()]
        try:
            self.consumer.commit(offsets=tps, asynchronous=False)
        except KafkaException as exc:
            raise BrokerUnavailable(f"could not commit {topic} offsets: {exc}") from exc

    def close(self) -> None:
        self.consumer.close()
