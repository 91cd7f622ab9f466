"""Driving :class:`pipeline.worker.Runtime` in the test process: a stand-in model, a
stand-in broker, and a way to know that the runtime has finished with what it was given."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pipeline.codecs.avro import result_codec
from pipeline.inference import Prediction
from pipeline.inference.outcome import BatchOutcome, Outcome
from pipeline.worker.publish import Publisher
from pipeline.worker.records import Incoming, record_size
from pipeline.worker.runtime import Runtime

__all__ = ["InstantBroker", "LengthEngine", "settle", "submit"]


class LengthEngine:
    """Stands in for the model (not the code under test): embeds a text as its
    length, never fails, yields to the event loop once per batch."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    async def run(self, texts: list[str], **_shape: int | None) -> BatchOutcome:
        self.batches.append(list(texts))
        await asyncio.sleep(0)
        outcomes = [Outcome(prediction=Prediction(embedding=[float(len(t))])) for t in texts]
        return BatchOutcome(outcomes=outcomes, batch_size=len(texts))

    def busy_fraction(self) -> float:
        return 0.0

    def tokenize_ms(self) -> float | None:
        return None

    overlaps = True  # two batches in the engine at once, as on a GPU


class InstantBroker:
    """Stands in for the answer producer (not the code under test): every send is
    acknowledged at once. ``results`` holds the decoded results in the order they
    were sent, ``letters`` the raw values sent to the dead-letter topic."""

    RESULTS, DLQ = "res", "dlq"

    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []
        self.letters: list[bytes] = []

    def publisher(self) -> Publisher:
        """A :class:`Publisher` that sends through this broker."""
        return Publisher(self.send, results_topic=self.RESULTS, dlq_topic=self.DLQ)

    async def send(self, topic: str, key: bytes | None, value: bytes) -> asyncio.Future[None]:
        if topic == self.RESULTS:
            self.results.append(result_codec().decode(value))
        else:
            self.letters.append(value)
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ack.set_result(None)
        return ack


async def settle(
    runtime: Runtime,
    batches: asyncio.Future[Any],
    done: Callable[[], bool],
    *,
    timeout_s: float = 30.0,
) -> None:
    """Return once ``done()`` holds, the scheduler holds nothing, and every task the
    runtime spawned has finished (``batches``, its :meth:`Runtime.run` loop, is
    cancelled then, with nothing left to batch).

    What the runtime was ever going to do with its inputs is done by then, so a
    test that reads its outputs afterwards checks "nothing more happens" without
    a sleep. Raises AssertionError when ``done()`` never holds.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not (done() and len(runtime.scheduler) == 0):
        assert loop.time() < deadline, f"not settled in {timeout_s} s: {runtime.counters}"
        await asyncio.sleep(0.005)
    batches.cancel()
    await runtime.close(timeout_s)


async def submit(runtime: Runtime, incoming: Incoming, *, timeout_s: float = 30.0) -> bool:
    """Hand ``incoming`` to :meth:`Runtime.take` once its lane has room, as the lane
    reader does in the worker (which waits for ``on_room`` instead of polling).
    Returns what ``take`` returns; raises AssertionError when the lane never has room."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    size = record_size(incoming.origin)
    while not runtime.has_room(incoming.lane, size):
        if loop.time() > deadline:
            raise AssertionError(f"lane {incoming.lane} never had room; {runtime.counters}")
        await asyncio.sleep(0.002)
    return runtime.take(incoming)
