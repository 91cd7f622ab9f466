"""A batch's results go out together (:meth:`Answers.results`): every result of a batch
is handed to the producer before the first acknowledgement is awaited, each input is
released only once its own result is acknowledged, and a refused one becomes a dead
letter while the others are answered.

The runtime is the real one; the model a stand-in; the producer a ``send_nowait``
whose acknowledgements the test resolves.
"""

from __future__ import annotations

import asyncio
from typing import Any

from support.runtime import LengthEngine, settle

from pipeline.codecs.avro import dead_letter_codec, result_codec
from pipeline.errors import PublishRejected
from pipeline.kafka.client import request_bytes
from pipeline.settings import Settings
from pipeline.worker.dedupe import Retention, StoredResults
from pipeline.worker.publish import Publisher
from pipeline.worker.records import Incoming, Origin
from pipeline.worker.runtime import Runtime


class _Producer:
    """Takes records at once (``send_nowait``); the test acknowledges them."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, asyncio.Future[None]]] = []

    def send_nowait(self, topic: str, key: bytes | None, value: bytes) -> asyncio.Future[None]:
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sent.append((topic, value, ack))
        return ack

    async def send(self, topic: str, key: bytes | None, value: bytes) -> asyncio.Future[None]:
        return self.send_nowait(topic, key, value)

    def results(self) -> list[str]:
        return [result_codec().decode(v)["request_id"] for t, v, _ in self.sent if t == "res"]


async def _until(condition: Any, what: str) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never: {what}")


def test_a_batch_sends_every_result_before_awaiting_the_first_ack() -> None:
    async def main() -> tuple[_Producer, list[int]]:
        producer = _Producer()
        released: list[int] = []

        async def release(token: Any) -> None:
            released.append(token)

        runtime = Runtime(
            Settings.from_env({"PIPELINE_SCHEDULER_WINDOW_MS": "50"}),
            engine=LengthEngine(),  # type: ignore[arg-type]
            publisher=Publisher(
                producer.send, results_topic="res", dlq_topic="dlq",
                send_nowait=producer.send_nowait,
            ),
            ack=release,
        )  # fmt: skip
        batches = asyncio.ensure_future(runtime.run())
        for offset in range(3):
            _rid, value = request_bytes(f"text number {offset}", request_id=f"r-{offset}")
            origin = Origin("lane.standard", 0, offset, 0, None, value)
            assert runtime.take(Incoming("standard", origin, token=offset))
        await _until(lambda: len(producer.results()) == 3, "three results sent")
        assert released == [], "released before its result was acknowledged"
        assert len(runtime._tasks) == 1, "one task answers the batch, not one per input"
        # The middle one is refused (surely not written): a dead letter; the others done.
        acks = [ack for topic, _v, ack in producer.sent if topic == "res"]
        acks[2].set_result(None)
        acks[1].set_exception(PublishRejected("res: refused"))
        acks[0].set_result(None)
        await _until(lambda: any(t == "dlq" for t, _v, _a in producer.sent), "a dead letter")
        for topic, _v, ack in producer.sent:
            if topic == "dlq":
                ack.set_result(None)
        await settle(runtime, batches, lambda: len(released) == 3)
        return producer, released

    producer, released = asyncio.run(main())
    assert producer.results() == ["r-0", "r-1", "r-2"]
    [letter] = [dead_letter_codec().decode(v) for t, v, _a in producer.sent if t == "dlq"]
    assert (letter["original_offset"], letter["stage"]) == (1, "publish")
    assert released == [0, 1, 2]  # in offset order, each once answered


def test_stored_results_found_together_go_out_together_and_a_refused_one_is_a_dead_letter() -> None:
    """Stored results found in one pass are served by one task: each sent before the
    first acknowledgement is awaited, released once its own is in; a refused one
    becomes a dead letter, an unusable one is computed, the others are answered."""

    async def main() -> tuple[_Producer, list[int], Runtime]:
        producer = _Producer()
        released: list[int] = []

        async def release(token: Any) -> None:
            released.append(token)

        settings = Settings.from_env({"PIPELINE_SCHEDULER_WINDOW_MS": "0"})
        store = StoredResults({}, retention=Retention(3_600_000), clock_ms=lambda: 1_000)
        runtime = Runtime(
            settings,
            engine=LengthEngine(),  # type: ignore[arg-type]
            publisher=Publisher(
                producer.send, results_topic="res", dlq_topic="dlq",
                send_nowait=producer.send_nowait,
            ),
            ack=release,
            stored=store,
        )  # fmt: skip
        stored = {
            "request_id": "old", "content_hash": "h", "model_name": "m",
            "model_version": settings.model.version, "priority": "bulk",
            "embedding": [1.0, 2.0], "served": "computed", "created_at_ms": 1,
            "completed_at_ms": 2,
        }  # fmt: skip
        for text in ("one", "two", "three"):
            store.put(runtime.keys(text), result_codec().encode(stored))
        store.put(runtime.keys("old"), result_codec().encode({**stored, "model_version": "0"}))
        batches = asyncio.ensure_future(runtime.run())
        for offset, text in enumerate(("one", "two", "old", "three")):
            _rid, value = request_bytes(text, request_id=f"r-{offset}")
            origin = Origin("lane.standard", 0, offset, 0, None, value)
            assert runtime.take(Incoming("standard", origin, token=offset))
        await _until(lambda: len(producer.results()) == 4, "four results sent")
        assert released == [], "released before its result was acknowledged"
        assert len(runtime._tasks) == 2, "one task serves the stored results, one the batch"
        acks = [ack for topic, _v, ack in producer.sent if topic == "res"]
        acks[3].set_result(None)  # "old", computed
        acks[1].set_exception(PublishRejected("res: refused"))
        for ack in (acks[2], acks[0]):
            ack.set_result(None)
        await _until(lambda: any(t == "dlq" for t, _v, _a in producer.sent), "a dead letter")
        for topic, _v, ack in producer.sent:
            if topic == "dlq":
                ack.set_result(None)
        await settle(runtime, batches, lambda: len(released) == 4)
        return producer, released, runtime

    producer, released, runtime = asyncio.run(main())
    served = [result_codec().decode(v) for t, v, _a in producer.sent if t == "res"]
    assert [(r["request_id"], r["served"]) for r in served] == [
        ("r-0", "stored"), ("r-1", "stored"), ("r-3", "stored"), ("r-2", "computed"),
    ]  # fmt: skip
    assert served[0]["embedding"] == [1.0, 2.0]
    [letter] = [dead_letter_codec().decode(v) for t, v, _a in producer.sent if t == "dlq"]
    assert (letter["original_offset"], letter["stage"]) == (1, "publish")
    assert sorted(released) == [0, 1, 2, 3]
    assert runtime.counters["stored"] == 2
