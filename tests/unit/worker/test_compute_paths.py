"""The compute stage's less travelled paths, in the worker's core (:class:`Runtime`):
the fallback model while the breaker is open, a request late at compute time, a
result served from memory while it is being stored, and the retry backoff.

The broker is a send function (acknowledged at once unless a test holds an
acknowledgement), the models stand-ins that record what they were given, the
store a plain dict under the real :class:`StoredResults`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from support.runtime import settle, submit

from pipeline.codecs.avro import dead_letter_codec, result_codec
from pipeline.errors import InferenceError
from pipeline.inference import BatchOutcome, Outcome, Prediction
from pipeline.kafka.client import request_bytes
from pipeline.settings import RetrySettings, Settings
from pipeline.worker.dedupe import Retention, StoredResults
from pipeline.worker.intake import parse
from pipeline.worker.publish import Publisher, backoff_ms
from pipeline.worker.records import Incoming, Origin, Work
from pipeline.worker.runtime import Runtime


class _Model:
    """Embeds a text as ``[scale * len(text)]``; fails texts containing 'poison'."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale
        self.texts: list[str] = []

    async def run(self, texts: list[str], **_shape: int | None) -> BatchOutcome:
        self.texts += texts
        await asyncio.sleep(0)
        outcomes = [
            Outcome(error=InferenceError("poisoned"))
            if "poison" in t
            else Outcome(prediction=Prediction(embedding=[self.scale * len(t)]))
            for t in texts
        ]
        return BatchOutcome(outcomes=outcomes, batch_size=len(texts))

    def busy_fraction(self) -> float:
        return 0.0

    def tokenize_ms(self) -> float | None:
        return None

    overlaps = True  # two batches in the engine at once, as on a GPU


class _Rig:
    """One runtime over a dict store; a fake clock that stands still unless moved."""

    def __init__(self, env: dict[str, str], *, fallback: _Model | None = None) -> None:
        self.model = _Model()
        self.results: list[dict[str, Any]] = []
        self.letters: list[dict[str, Any]] = []
        self.released: list[int] = []
        self.held: list[asyncio.Future[None]] = []  # result acks a test holds back
        self.hold_results = False
        self.now = 1_000_000
        self.table: dict[bytes, bytes] = {}
        self.settings = Settings.from_env(
            {"PIPELINE_SCHEDULER_WINDOW_MS": "0", "PIPELINE_WORKER_EXPIRE_LANES": "", **env}
        )
        self.runtime = Runtime(
            self.settings,
            engine=self.model,  # type: ignore[arg-type]
            publisher=Publisher(self._send, results_topic="res", dlq_topic="dlq"),
            ack=self._release,
            stored=StoredResults(
                self.table, retention=Retention(3_600_000), clock_ms=lambda: self.now
            ),
            fallback=fallback,  # type: ignore[arg-type]
            fallback_model=("fallback-model", "9") if fallback is not None else None,
            clock_ms=lambda: self.now,
        )
        self.batches: asyncio.Future[None] | None = None
        self.offset = 0

    async def _send(self, topic: str, key: bytes | None, value: bytes) -> asyncio.Future[None]:
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if topic == "res":
            self.results.append(result_codec().decode(value))
            if self.hold_results:
                self.held.append(ack)
                return ack
        else:
            self.letters.append(dead_letter_codec().decode(value))
        ack.set_result(None)
        return ack

    async def _release(self, token: Any) -> None:
        self.released.append(token)

    def incoming(self, text: str, lane: str = "standard", **fields: Any) -> Incoming:
        _rid, value = request_bytes(text, request_id=f"r-{self.offset}", **fields)
        origin = Origin(f"lane.{lane}", 0, self.offset, 0, None, value)
        self.offset += 1
        return Incoming(lane, origin, token=origin.offset)

    async def submit(self, *texts: str) -> None:
        if self.batches is None:
            self.batches = asyncio.ensure_future(self.runtime.run())
        for text in texts:
            await submit(self.runtime, self.incoming(text))

    async def until(self, check: Callable[[], bool], what: str) -> None:
        for _ in range(2000):
            if check():
                return
            await asyncio.sleep(0.005)
        raise AssertionError(f"never: {what}; {self.runtime.counters}")

    async def settle(self) -> None:
        """Everything done: the runtime's tasks ended, its batch loop stopped."""
        batches = self.batches or asyncio.ensure_future(asyncio.sleep(0))
        await settle(self.runtime, batches, lambda: True)


def test_the_fallback_answers_while_the_breaker_is_open_and_is_never_stored() -> None:
    async def main() -> _Rig:
        rig = _Rig(
            {
                "PIPELINE_BREAKER_FAILURES_TO_OPEN": "1",
                "PIPELINE_BREAKER_OPEN_MS": "600000",  # the fake clock never gets there
                "PIPELINE_BREAKER_OPEN_MS_MAX": "600000",
                "PIPELINE_RETRY_MAX_ATTEMPTS": "1",
            },
            fallback=_Model(scale=-1.0),
        )
        await rig.submit("a text before any failure")
        await rig.until(lambda: rig.released == [0], "the first text answered")
        assert len(rig.table) == 1  # the primary model's result is stored
        await rig.submit("a poison pill")  # a batch that fails as a whole: open
        await rig.until(lambda: rig.released == [0, 1], "the pill dead-lettered")
        await rig.submit("a healthy text while it is open")
        await rig.until(lambda: rig.released == [0, 1, 2], "the healthy text answered")
        await rig.settle()
        return rig

    rig = asyncio.run(main())
    assert [d["request_id"] for d in rig.letters] == ["r-1"]
    first, open_ = rig.results
    assert (first["model_name"], first["embedding"]) != ("fallback-model", None)
    assert open_["request_id"] == "r-2"
    assert (open_["model_name"], open_["model_version"]) == ("fallback-model", "9")
    assert open_["embedding"] == [-float(len("a healthy text while it is open"))]
    assert "a healthy text while it is open" not in rig.model.texts
    assert len(rig.table) == 1, "a fallback result was stored"


def test_a_request_late_when_its_batch_runs_is_computed_the_scheduler_alone_expires() -> None:
    """Expiry is decided once, by the scheduler, when it plans a batch; a planned request
    whose deadline passes while its batch waits for the engine is computed, late."""

    async def main() -> _Rig:
        rig = _Rig({"PIPELINE_WORKER_EXPIRE_LANES": "realtime"})
        incoming = rig.incoming("too late", lane="realtime", deadline_ms=rig.now + 50)
        request = parse(
            incoming.origin.value,
            lane="realtime",
            lane_deadline_ms=rig.settings.worker.lane_deadline_ms("realtime"),
            model_id=rig.settings.model.model_id,
            limits=rig.settings.validation,
            received_at_ms=rig.now,
        )
        assert rig.runtime.ledger.hold(incoming)
        rig.now += 51  # the deadline passed while the batch waited for the model
        ran = await rig.runtime.compute.run_batch([Work(incoming, request, rig.now - 51)])
        assert ran is not None  # it reached the model
        await rig.until(lambda: rig.released == [0], "the input released")
        await rig.settle()
        return rig

    rig = asyncio.run(main())
    assert rig.model.texts == ["too late"] and rig.letters == []
    [result] = rig.results
    assert result["served"] == "computed"


def test_a_twin_queued_while_the_result_is_stored_is_served_from_memory() -> None:
    async def main() -> _Rig:
        rig = _Rig({})
        rig.hold_results = True  # the first result stays unacknowledged, so unstored
        await rig.submit("the same text twice")
        await rig.until(lambda: len(rig.results) == 1, "the first result published")
        assert rig.table == {}
        rig.hold_results = False
        await rig.submit("the same text twice")  # the store has nothing yet
        await rig.until(lambda: len(rig.results) == 2, "the twin's result published")
        for ack in rig.held:
            ack.set_result(None)
        await rig.until(lambda: rig.released == [0, 1], "both released")
        await rig.settle()
        return rig

    rig = asyncio.run(main())
    assert rig.model.texts == ["the same text twice"], "the twin was computed again"
    assert [r["served"] for r in rig.results] == ["computed", "inflight"]
    assert rig.results[0]["embedding"] == rig.results[1]["embedding"]
    assert len(rig.table) == 1


def test_backoff_doubles_up_to_its_cap_with_full_jitter() -> None:
    retry = RetrySettings(max_attempts=10, backoff_base_ms=50, backoff_max_ms=2000)

    class Top(random.Random):
        def uniform(self, a: float, b: float) -> float:
            return b

    caps = [backoff_ms(attempt, retry, Top()) for attempt in range(1, 9)]
    assert caps == [50, 100, 200, 400, 800, 1600, 2000, 2000]
    rng = random.Random(7)
    draws = [backoff_ms(3, retry, rng) for _ in range(200)]
    assert all(0 <= d <= 200 for d in draws)
    # Full jitter: spread over the whole range, not bunched at the cap.
    assert min(draws) < 40 and max(draws) > 160
