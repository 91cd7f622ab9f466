"""Expiry while a batch runs, in the worker's core (:class:`Runtime`, issue 31): a queued
realtime request that can no longer make its deadline is dead-lettered while the
engine is still busy with a batch that runs long, not once that batch ended.

The model is a stand-in that runs one batch at a time, as a CPU does, and holds
its batch until the test lets it go; the clock is fake and moves when told.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from support.runtime import InstantBroker, LengthEngine, settle, submit

from pipeline.codecs.avro import dead_letter_codec
from pipeline.inference import BatchOutcome
from pipeline.kafka.client import request_bytes
from pipeline.settings import Settings
from pipeline.worker.records import Incoming, Origin
from pipeline.worker.runtime import Runtime


class _HeldModel(LengthEngine):
    """The support stand-in, one batch at a time (a CPU: no overlap), each held until
    ``go`` is set; ``texts`` are those that reached it."""

    overlaps = False

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.texts: list[str] = []

    async def run(self, texts: list[str], **shape: int | None) -> BatchOutcome:
        self.texts += texts  # in the engine from now, held until the test lets it go
        await self.go.wait()
        return await super().run(texts, **shape)


def test_a_hopeless_request_is_dead_lettered_while_the_running_batch_still_runs() -> None:
    async def main() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str], bool]:
        now = [1_000_000]
        broker = InstantBroker()
        model = _HeldModel()

        async def release(_token: Any) -> None:
            return None

        def letters() -> list[dict[str, Any]]:
            return [dead_letter_codec().decode(v) for v in broker.letters]

        runtime = Runtime(
            Settings.from_env({"PIPELINE_SCHEDULER_WINDOW_MS": "0",
                               "PIPELINE_WORKER_EXPIRE_LANES": "realtime"}),
            engine=model,  # type: ignore[arg-type]
            publisher=broker.publisher(),
            ack=release,
            clock_ms=lambda: now[0],
        )  # fmt: skip
        batches = asyncio.ensure_future(runtime.run())

        def incoming(offset: int, text: str, lane: str, **fields: Any) -> Incoming:
            _rid, value = request_bytes(text, request_id=f"r-{offset}", **fields)
            return Incoming(lane, Origin(f"lane.{lane}", 0, offset, 0, None, value), token=offset)

        async def until(check: Callable[[], bool], what: str) -> None:
            for _ in range(2000):
                if check():
                    return
                await asyncio.sleep(0.005)
            raise AssertionError(f"never: {what}")

        assert await submit(runtime, incoming(0, "a bulk text that runs long", "bulk"))
        await until(lambda: model.texts != [], "the bulk batch in the engine")
        deadline = now[0] + 100
        assert await submit(runtime, incoming(1, "urgent", "realtime", deadline_ms=deadline))
        await asyncio.sleep(0.05)
        assert letters() == []  # it can still make it if the batch ends soon
        now[0] = deadline - 2  # the batch ran long: too little time left for any batch
        await until(lambda: letters() != [], "the realtime request dead-lettered")
        still_running = not model.go.is_set()
        model.go.set()
        await settle(runtime, batches, lambda: len(broker.results) == 1)
        return broker.results, letters(), model.texts, still_running

    results, letters, texts, still_running = asyncio.run(main())
    assert still_running  # dead-lettered before the running batch ended
    [letter] = letters
    assert letter["request_id"] == "r-1" and letter["stage"] == "expired"
    assert "while a batch ran" in letter["error_message"]
    assert "urgent" not in texts  # it never reached the model
    assert [r["request_id"] for r in results] == ["r-0"]
