"""A publish the broker never acknowledges: the worker's core never releases the input
on a lost answer (README, "Guarantees").

A result that is not acknowledged after the retries becomes a dead letter with
stage ``publish``; when the dead letter is not acknowledged either, the input
stays unreleased (its offset is never committed), so it is delivered again
after a restart. The broker is replaced by a send function whose
acknowledgements fail for chosen topics; the model by one that never fails.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pipeline.client import request_bytes
from pipeline.codec import dead_letter_codec
from pipeline.inference import BatchOutcome, Outcome, Prediction
from pipeline.publish import Origin, Publisher
from pipeline.settings import Settings
from pipeline.worker import Incoming, Runtime


class _Engine:
    async def run(self, texts: list[str], **_shape: int | None) -> BatchOutcome:
        await asyncio.sleep(0)
        outcomes = [Outcome(prediction=Prediction(embedding=[float(len(t))])) for t in texts]
        return BatchOutcome(outcomes=outcomes, batch_size=len(texts))

    def busy_fraction(self) -> float:
        return 0.0

    def tokenize_ms(self) -> float | None:
        return None


async def _answer(n: int, failing: set[str]) -> tuple[dict[str, list[bytes]], list[int], int]:
    """Submit ``n`` valid requests; sends to ``failing`` topics are never acknowledged.

    Returns what was acknowledged per topic, the released offsets, and the number
    of send attempts once every input has used up its attempts or been released.
    """
    delivered: dict[str, list[bytes]] = {"res": [], "dlq": []}
    released: list[int] = []
    attempts = 0

    async def send(topic: str, key: bytes | None, value: bytes) -> asyncio.Future[None]:
        nonlocal attempts
        attempts += 1
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if topic in failing:
            ack.set_exception(ConnectionError("broker went away"))
        else:
            delivered[topic].append(value)
            ack.set_result(None)
        return ack

    async def release(token: Any) -> None:
        released.append(token)

    s = Settings.from_env(
        {"PIPELINE_RETRY_MAX_ATTEMPTS": "2", "PIPELINE_RETRY_BACKOFF_BASE_MS": "1"}
    )
    runtime = Runtime(
        s,
        engine=_Engine(),  # type: ignore[arg-type]
        publisher=Publisher(send, results_topic="res", dlq_topic="dlq", retry=s.retry),
        ack=release,
    )
    # Every input tries its result twice, then (when results fail) its dead letter twice.
    most = n * (2 + 2 * ("res" in failing))
    batches = asyncio.ensure_future(runtime.run())
    try:
        for offset in range(n):
            _rid, value = request_bytes(f"text number {offset}", request_id=f"r-{offset}")
            origin = Origin("lane.standard", 0, offset, 0, None, value)
            await runtime.submit(Incoming(lane="standard", origin=origin, token=offset))
        for _ in range(500):
            if len(released) == n or attempts >= most:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # nothing more may happen
    finally:
        batches.cancel()
        await runtime.close(1.0)
    return delivered, released, attempts


def test_an_unacknowledged_result_becomes_a_publish_dead_letter() -> None:
    delivered, released, _ = asyncio.run(_answer(3, failing={"res"}))
    assert delivered["res"] == []
    letters = [dead_letter_codec().decode(v) for v in delivered["dlq"]]
    assert sorted(d["original_offset"] for d in letters) == [0, 1, 2]
    assert {(d["stage"], d["error_class"]) for d in letters} == {("publish", "PublishError")}
    assert released == [0, 1, 2]


def test_an_input_whose_dead_letter_is_lost_too_is_never_released() -> None:
    delivered, released, attempts = asyncio.run(_answer(3, failing={"res", "dlq"}))
    assert attempts == 3 * 4, "each input: two result tries, then two dead-letter tries"
    assert delivered == {"res": [], "dlq": []}
    assert released == []
