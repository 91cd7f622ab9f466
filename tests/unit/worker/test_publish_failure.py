"""A publish that fails: the worker's core never holds an input silently, and never
answers one input twice in two ways (README, "Guarantees").

A result the broker refused for good (``PublishRejected``: surely not written)
becomes a dead letter with stage ``publish``. Any other failure (a delivery
that timed out: the result may be written) is never followed by a dead letter
and never resent by Python: the answer path calls ``on_fatal`` (the worker
stops) and the input stays unreleased (redelivered after the restart). So does
a dead letter that is refused, and any exception that escapes a pipeline task.
The broker is replaced by a send function whose acknowledgements fail for chosen
topics; the model by one that never fails.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
from typing import Any

import fastavro
from support.runtime import LengthEngine, settle, submit

from pipeline.codecs.avro import dead_letter_codec
from pipeline.errors import AnswerPathFailure, PublishRejected
from pipeline.kafka.client import request_bytes
from pipeline.kafka.producer import MAX_MESSAGE_BYTES
from pipeline.observability.metrics import PipelineMetrics
from pipeline.settings import Settings
from pipeline.worker.publish import (
    DEAD_LETTER_KEY_PREFIX,
    DEAD_LETTER_VALUE_PREFIX,
    Publisher,
    dead_letter_record,
)
from pipeline.worker.records import Incoming, Origin
from pipeline.worker.runtime import Runtime


async def _answer(
    n: int, failing: dict[str, Exception]
) -> tuple[dict[str, list[bytes]], list[int], int, list[BaseException]]:
    """Submit ``n`` valid requests; sends to a ``failing`` topic fail with its exception.

    Returns what was acknowledged per topic, the released offsets, the number of
    send attempts and the failures handed to ``on_fatal``, once settled.
    """
    delivered: dict[str, list[bytes]] = {"res": [], "dlq": []}
    released: list[int] = []
    fatal: list[BaseException] = []
    attempts = 0

    async def send(topic: str, key: bytes | None, value: bytes) -> asyncio.Future[None]:
        nonlocal attempts
        attempts += 1
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if topic in failing:
            ack.set_exception(failing[topic])
        else:
            delivered[topic].append(value)
            ack.set_result(None)
        return ack

    async def release(token: Any) -> None:
        released.append(token)

    s = Settings.from_env({"PIPELINE_RETRY_BACKOFF_BASE_MS": "1"})
    runtime = Runtime(
        s,
        engine=LengthEngine(),  # type: ignore[arg-type]
        publisher=Publisher(send, results_topic="res", dlq_topic="dlq", on_fatal=fatal.append),
        ack=release,
    )
    # Every input sends its result once, then (when results are refused) its dead letter once.
    most = n * (1 + isinstance(failing.get("res"), PublishRejected))
    batches = asyncio.ensure_future(runtime.run())
    try:
        for offset in range(n):
            _rid, value = request_bytes(f"text number {offset}", request_id=f"r-{offset}")
            origin = Origin("lane.standard", 0, offset, 0, None, value)
            await submit(runtime, Incoming(lane="standard", origin=origin, token=offset))
        # Settled: every task the runtime spawned has ended, so the attempts
        # counted below are all it will ever make.
        await settle(runtime, batches, lambda: len(released) == n or attempts >= most)
    finally:
        batches.cancel()
        await runtime.close(1.0)
    return delivered, released, attempts, fatal


def test_a_refused_result_becomes_a_publish_dead_letter() -> None:
    refused = PublishRejected("res: MSG_SIZE_TOO_LARGE (refused; not written)")
    delivered, released, attempts, fatal = asyncio.run(_answer(3, failing={"res": refused}))
    assert delivered["res"] == []
    letters = [dead_letter_codec().decode(v) for v in delivered["dlq"]]
    assert sorted(d["original_offset"] for d in letters) == [0, 1, 2]
    assert {(d["stage"], d["error_class"]) for d in letters} == {("publish", "PublishRejected")}
    assert released == [0, 1, 2]
    assert attempts == 6, "one result and one dead letter each: nothing resent"
    assert fatal == []


def test_a_result_of_unknown_fate_gets_no_dead_letter_and_stops_the_worker() -> None:
    timed_out = AnswerPathFailure("res: _MSG_TIMED_OUT (the record may or may not be written)")
    delivered, released, attempts, fatal = asyncio.run(_answer(3, failing={"res": timed_out}))
    assert delivered == {"res": [], "dlq": []}, "no dead letter after an ambiguous failure"
    assert attempts == 3, "Python never resends: librdkafka retries within its bound"
    assert released == [], "the inputs stay uncommitted: redelivered after the restart"
    assert fatal == [timed_out], "the worker is stopped, once"


def test_any_other_exception_on_the_answer_path_stops_the_worker() -> None:
    delivered, released, _, fatal = asyncio.run(
        _answer(2, failing={"res": ConnectionError("broker went away")})
    )
    assert delivered == {"res": [], "dlq": []}
    assert released == []
    assert len(fatal) == 1 and isinstance(fatal[0], AnswerPathFailure)


def test_an_input_whose_dead_letter_is_refused_is_never_released() -> None:
    refused = PublishRejected("refused")
    delivered, released, attempts, fatal = asyncio.run(
        _answer(3, failing={"res": refused, "dlq": PublishRejected("dlq: not authorised")})
    )
    assert attempts == 3 * 2, "each input: one result try, then one dead-letter try"
    assert delivered == {"res": [], "dlq": []}
    assert released == []
    assert len(fatal) == 1 and "dead letter refused" in str(fatal[0])


def test_an_exception_escaping_a_pipeline_task_stops_the_worker() -> None:
    async def run() -> list[BaseException]:
        fatal: list[BaseException] = []

        async def send(topic: str, key: bytes | None, value: bytes) -> asyncio.Future[None]:
            raise AssertionError("unreachable")

        async def release(token: Any) -> None:
            pass

        runtime = Runtime(
            Settings.from_env({}),
            engine=LengthEngine(),  # type: ignore[arg-type]
            publisher=Publisher(send, results_topic="r", dlq_topic="d", on_fatal=fatal.append),
            ack=release,
        )

        async def broken() -> None:
            raise KeyError("a bug on the answer path")

        task = runtime._spawn(broken())
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
        return fatal

    (failure,) = asyncio.run(run())
    assert isinstance(failure, AnswerPathFailure) and "a bug on the answer path" in str(failure)


def test_an_unreleased_input_shows_its_age() -> None:
    async def run() -> tuple[int, int]:
        now = [1_000]

        async def send(topic: str, key: bytes | None, value: bytes) -> asyncio.Future[None]:
            return asyncio.get_running_loop().create_future()  # never acknowledged

        async def release(token: Any) -> None:
            pass

        runtime = Runtime(
            Settings.from_env({}),
            engine=LengthEngine(),  # type: ignore[arg-type]
            publisher=Publisher(send, results_topic="r", dlq_topic="d"),
            ack=release,
            clock_ms=lambda: now[0],
            metrics=PipelineMetrics(process_collectors=False),
        )
        before = runtime.ledger.oldest_ms()
        origin = Origin("lane.standard", 0, 7, 0, None, b"not a request")
        await submit(runtime, Incoming(lane="standard", origin=origin, token=7))
        now[0] += 90_000
        age = runtime.ledger.oldest_ms()
        await runtime.close(0.1)
        return before, age

    assert asyncio.run(run()) == (0, 90_000)


# -- the dead letter's copy of a large input is bounded -----------------------


def test_a_dead_letter_copies_a_bounded_prefix_with_the_length_and_sha256() -> None:
    value = bytes(range(256)) * 4_100  # 1,049,600 bytes
    key = b"k" * 5_000
    origin = Origin("lane.bulk", 2, 117, 5, key, value)
    record = dead_letter_record(
        origin,
        stage="decode",
        error=ValueError("\u20ac" * 5_000),  # 3 bytes each in UTF-8
        attempts=1,
        failed_at_ms=9,
        request_id="r" * 10_000,
    )
    encoded = dead_letter_codec().encode(record)
    assert len(encoded) < 100_000 < MAX_MESSAGE_BYTES
    back = dead_letter_codec().decode(encoded)
    assert (back["original_topic"], back["original_partition"], back["original_offset"]) == (
        "lane.bulk",
        2,
        117,
    )
    assert back["value"] == value[:DEAD_LETTER_VALUE_PREFIX]
    assert back["value_length"] == len(value)
    assert back["value_sha256"] == hashlib.sha256(value).hexdigest()
    assert back["key"] == key[:DEAD_LETTER_KEY_PREFIX] and back["key_length"] == 5_000


def test_a_small_input_is_copied_whole_and_says_nothing_more() -> None:
    origin = Origin("lane.bulk", 0, 1, 5, b"key", b"value")
    record = dead_letter_record(
        origin, stage="decode", error=ValueError("x"), attempts=1, failed_at_ms=9, request_id=None
    )
    back = dead_letter_codec().decode(dead_letter_codec().encode(record))
    assert (back["key"], back["value"]) == (b"key", b"value")
    assert back["value_length"] is None and back["value_sha256"] is None
    assert back["key_length"] is None


def test_both_dead_letter_versions_read_each_other() -> None:
    codec = dead_letter_codec()
    (v1,) = [v for v in codec.by_fingerprint.values() if v.path.parent.name == "history"]
    # A v1 record, written out field by field on purpose: support.dead_letters
    # makes records of the current schema only.
    old = {
        "original_topic": "lane.bulk",
        "original_partition": 0,
        "original_offset": 3,
        "original_timestamp_ms": 1,
        "key": None,
        "value": b"abc",
        "stage": "decode",
        "error_class": "DecodeError",
        "error_message": "bad",
        "attempts": 1,
        "failed_at_ms": 2,
        "request_id": None,
        "worker": "w",
    }
    # A v1 record still decodes, with the new fields empty.
    back = codec.decode(codec.encode(old, v1))
    assert back["value"] == b"abc" and back["value_length"] is None
    # A reader on v1 reads a v2 record: Avro resolution drops the new fields.
    new = {**old, "value_length": 10, "value_sha256": "00", "key_length": None}
    body = codec.encode(new)[10:]
    read = fastavro.schemaless_reader(io.BytesIO(body), codec.current.parsed, v1.parsed)
    assert read == old
