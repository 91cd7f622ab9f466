"""The pipelined engine (tokenize batch N+1 while N computes), padding and the thread budget.

Unit tier: no broker. Overlap is observed through events that a fake model
sets and waits on, never through timing; the padding tests use the tiny BERT.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from support.predictions import floats
from support.runtime import submit

from pipeline.errors import ConfigurationError, InferenceError
from pipeline.inference import (
    BatchOutcome,
    Encoded,
    InferenceEngine,
    Outcome,
    Prediction,
    load_model,
)
from pipeline.inference.model import Model
from pipeline.inference.threads import apply_thread_budget
from pipeline.kafka.client import request_bytes
from pipeline.settings import ModelSettings, Settings
from pipeline.worker.publish import Publisher
from pipeline.worker.records import Incoming, Origin
from pipeline.worker.runtime import Runtime


class StagedFake:
    """Logs each stage per batch (``tokenize:<first text>``, ``forward:...``, ``done:...``)
    with its thread; ``hold`` makes forward of that batch wait for ``release``; texts
    with 'untokenizable' fail tokenisation, texts with 'bad' fail forward."""

    def __init__(self, hold: str | None = None) -> None:
        self.hold = hold
        self.release = threading.Event()
        self.log: list[tuple[str, int]] = []
        self.seen: dict[str, threading.Event] = {}
        self.hints: list[tuple[int | None, int | None]] = []
        self._lock = threading.Lock()

    def _note(self, what: str) -> None:
        with self._lock:
            self.log.append((what, threading.get_ident()))
            self.seen.setdefault(what, threading.Event()).set()

    def wait_for(self, what: str) -> bool:
        with self._lock:
            event = self.seen.setdefault(what, threading.Event())
        return event.wait(10)

    def tokenize(
        self, texts: list[str], *, pad_to: int | None = None, rows: int | None = None
    ) -> Encoded:
        self._note(f"tokenize:{texts[0]}")
        self.hints.append((pad_to, rows))
        if any("untokenizable" in t for t in texts):
            raise ValueError("cannot tokenize")
        ids = torch.zeros((len(texts), 4), dtype=torch.long)
        return Encoded(list(texts), {"input_ids": ids}, 4 * len(texts), ids.numel())

    def forward(self, enc: Encoded) -> list[Prediction]:
        self._note(f"forward:{enc.texts[0]}")
        if enc.texts[0] == self.hold:
            assert self.release.wait(10)
        if any("bad" in t for t in enc.texts):
            raise ValueError("bad input")
        self._note(f"done:{enc.texts[0]}")
        return [Prediction(embedding=[float(len(t))]) for t in enc.texts]

    def index(self, what: str) -> int:
        return [w for w, _ in self.log].index(what)


@pytest.fixture
def engine_of() -> Iterator[list[InferenceEngine]]:
    engines: list[InferenceEngine] = []
    yield engines
    for engine in engines:
        assert engine.stop(timeout=10)


def _started(engines: list[InferenceEngine], fake: StagedFake, **kw: Any) -> InferenceEngine:
    engine = InferenceEngine(fake, **kw)
    engine.start()
    engines.append(engine)
    return engine


def test_next_batch_is_tokenized_while_the_current_one_computes(
    engine_of: list[InferenceEngine],
) -> None:
    fake = StagedFake(hold="one")
    engine = _started(engine_of, fake)

    async def main() -> list[BatchOutcome]:
        first = asyncio.create_task(engine.run(["one", "uno"]))
        second = asyncio.create_task(engine.run(["two"]))
        loop = asyncio.get_running_loop()
        # Batch "one" is held inside forward; batch "two" must get tokenised meanwhile.
        overlapped = await loop.run_in_executor(None, fake.wait_for, "tokenize:two")
        still_running = "done:one" not in [w for w, _ in fake.log]
        fake.release.set()
        assert overlapped and still_running
        return list(await asyncio.gather(first, second))

    one, two = asyncio.run(main())
    assert fake.index("tokenize:two") < fake.index("done:one") < fake.index("forward:two")
    threads = dict(fake.log)
    names = {t.ident: t.name for t in threading.enumerate()}
    assert threads["tokenize:one"] == threads["tokenize:two"]
    assert threads["forward:one"] == threads["forward:two"]
    assert names[threads["tokenize:one"]] == "inference-tokenizer"
    assert names[threads["forward:one"]] == "inference"
    assert [o.prediction for o in one.outcomes] == [
        Prediction(embedding=[3.0]),
        Prediction(embedding=[3.0]),
    ]
    assert [o.prediction for o in two.outcomes] == [Prediction(embedding=[3.0])]
    assert engine.tokenize_ms() is not None


def test_many_batches_keep_their_order_and_outcomes(engine_of: list[InferenceEngine]) -> None:
    fake = StagedFake()
    engine = _started(engine_of, fake, queue_size=2)
    batches = [[f"b{i}-{'x' * j}" for j in range(i % 4 + 1)] for i in range(12)]
    batches[5][1] = "b5-bad"

    async def main() -> list[BatchOutcome]:
        return list(await asyncio.gather(*(engine.run(b) for b in batches)))

    results = asyncio.run(main())
    for texts, result in zip(batches, results, strict=True):
        assert result.batch_size == len(texts) == len(result.outcomes)
        for text, outcome in zip(texts, result.outcomes, strict=True):
            if "bad" in text:
                assert not outcome.ok and isinstance(outcome.error, InferenceError)
            else:
                assert outcome.prediction == Prediction(embedding=[float(len(text))])
    assert engine.stats().batches == 12 and engine.stats().failures == 1


def test_a_batch_that_fails_to_tokenize_is_bisected(engine_of: list[InferenceEngine]) -> None:
    fake = StagedFake()
    engine = _started(engine_of, fake)
    texts = ["a", "b", "c untokenizable", "d"]
    result = asyncio.run(engine.run(texts, pad_to=32, rows=8))
    assert [o.ok for o in result.outcomes] == [True, True, False, True]
    assert isinstance(result.outcomes[2].error, InferenceError)
    assert isinstance(result.outcomes[2].error.__cause__, ValueError)
    # The whole batch gets the bucketed shape; bisected parts keep the length only.
    assert fake.hints[0] == (32, 8)
    assert len(fake.hints) > 1 and all(h == (32, None) for h in fake.hints[1:])
    assert result.model_calls == len(fake.hints)


def test_busy_fraction_counts_only_the_inference_thread(
    engine_of: list[InferenceEngine],
) -> None:
    now = [100.0]

    class Timed(StagedFake):
        def tokenize(
            self, texts: list[str], *, pad_to: int | None = None, rows: int | None = None
        ) -> Encoded:
            now[0] += 3.0  # tokenising takes three (fake) seconds
            return super().tokenize(texts, pad_to=pad_to, rows=rows)

        def forward(self, enc: Encoded) -> list[Prediction]:
            now[0] += 2.0  # computing takes two
            return super().forward(enc)

    engine = _started(engine_of, Timed(), busy_window_s=60.0, clock=lambda: now[0])
    asyncio.run(engine.run(["a"]))
    assert engine.busy_fraction() == pytest.approx(2.0 / 5.0)


def test_stop_drains_prepared_and_queued_jobs(engine_of: list[InferenceEngine]) -> None:
    fake = StagedFake(hold="first")
    engine = _started(engine_of, fake)

    async def main() -> list[BatchOutcome]:
        jobs = [asyncio.create_task(engine.run([t])) for t in ("first", "second", "third")]
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, fake.wait_for, "tokenize:second")
        stopper = loop.run_in_executor(None, lambda: engine.stop(timeout=10))
        fake.release.set()
        assert await stopper
        return list(await asyncio.gather(*jobs))

    results = asyncio.run(main())
    assert all(r.outcomes[0].ok for r in results)
    assert not any(t.name.startswith("inference") for t in threading.enumerate())


# -- padding to the scheduler's buckets (the tiny BERT) -----------------------


def test_padding_to_the_bucket_and_shape_keeps_every_embedding(tiny_dir: Path) -> None:
    texts = ["good movie", "the film is very very good", "bad"]
    longest = load_model(ModelSettings(process="off", path=str(tiny_dir), padding="longest"))
    bucket = load_model(ModelSettings(process="off", path=str(tiny_dir), padding="bucket"))
    shape = load_model(ModelSettings(process="off", path=str(tiny_dir), padding="shape"))
    plain = longest.tokenize(texts, pad_to=32, rows=8)
    assert plain.tensors["input_ids"].shape == (3, 8)  # [CLS] + 6 words + [SEP]; hints ignored
    by_bucket = bucket.tokenize(texts, pad_to=32, rows=8)
    assert by_bucket.tensors["input_ids"].shape == (3, 32)
    by_shape = shape.tokenize(texts, pad_to=32, rows=8)
    assert by_shape.tensors["attention_mask"].shape == (8, 32)
    assert by_shape.n_tokens == by_bucket.n_tokens == plain.n_tokens
    assert by_shape.padded_tokens == 8 * 32 and by_bucket.padded_tokens == 3 * 32
    want = longest.forward(plain)
    for model, enc in ((bucket, by_bucket), (shape, by_shape)):
        got = model.forward(enc)
        assert len(got) == len(texts)
        for a, b in zip(want, got, strict=True):
            assert a.embedding is not None and b.embedding is not None
            assert torch.allclose(torch.tensor(floats(a)), torch.tensor(floats(b)), atol=1e-5)


def test_pad_to_never_truncates_and_stops_at_max_length(tiny_dir: Path) -> None:
    model = load_model(
        ModelSettings(process="off", path=str(tiny_dir), padding="bucket", max_length=20)
    )
    texts = ["good " * 12, "bad"]
    assert model.tokenize(texts, pad_to=4).tensors["input_ids"].shape == (2, 14)
    assert model.tokenize(texts, pad_to=64).tensors["input_ids"].shape == (2, 20)


def test_auto_padding_is_longest_on_a_cpu(tiny_dir: Path) -> None:
    model = load_model(ModelSettings(process="off", path=str(tiny_dir)))
    assert isinstance(model, Model) and model.padding == "longest"
    assert model.tokenize(["good"], pad_to=32).tensors["input_ids"].shape == (1, 3)


def test_engine_pads_through_to_the_real_model(tiny_dir: Path) -> None:
    model = load_model(ModelSettings(process="off", path=str(tiny_dir), padding="shape"))
    engine = InferenceEngine(model)
    engine.start()
    try:
        result = asyncio.run(engine.run(["good", "bad movie"], pad_to=16, rows=4))
    finally:
        assert engine.stop(timeout=10)
    assert all(o.ok for o in result.outcomes) and result.padded_tokens == 4 * 16


def test_only_an_engine_on_a_gpu_overlaps_batches(tiny_dir: Path) -> None:
    model = load_model(ModelSettings(process="off", path=str(tiny_dir)))
    assert isinstance(model, Model)
    assert InferenceEngine(model).overlaps is False  # this machine's CPU
    model.device = torch.device("cuda", 0)  # what the runtime asks; nothing runs there
    assert InferenceEngine(model).overlaps is True


# -- settings and the thread budget ------------------------------------------


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"PIPELINE_MODEL_PADDING": "wide"}, "PIPELINE_MODEL_PADDING='wide'"),
        ({"PIPELINE_MODEL_TOKENIZER_THREADS": "-1"}, "PIPELINE_MODEL_TOKENIZER_THREADS=-1"),
        ({"PIPELINE_MODEL_TORCH_THREADS": "-2"}, "PIPELINE_MODEL_TORCH_THREADS=-2"),
        ({"PIPELINE_MODEL_TORCH_INTEROP_THREADS": "-1"}, "PIPELINE_MODEL_TORCH_INTEROP"),
    ],
)
def test_bad_thread_and_padding_settings_stop_start_up(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        Settings.from_env(env)


def test_thread_budget_defaults_and_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    # Let monkeypatch restore what apply_thread_budget writes.
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "unset-by-test")
    monkeypatch.setenv("RAYON_NUM_THREADS", "99")
    before = torch.get_num_threads()
    try:
        settings = Settings.from_env({}).model
        assert (settings.torch_threads, settings.tokenizer_threads) == (0, 1)
        applied = apply_thread_budget(settings)
        cores = len(os.sched_getaffinity(0))
        assert applied["torch_threads"] == max(1, cores - 1) == torch.get_num_threads()
        assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
        assert "RAYON_NUM_THREADS" not in os.environ
        applied = apply_thread_budget(ModelSettings(torch_threads=1, tokenizer_threads=3))
        assert applied["torch_threads"] == 1 == torch.get_num_threads()
        assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
        assert os.environ["RAYON_NUM_THREADS"] == "3"
    finally:
        torch.set_num_threads(before)


# -- the worker hands the next batch over just before the running one ends -----


class HeldEngine:
    """An engine whose every batch runs until the test releases it."""

    def __init__(self, *, overlaps: bool = True) -> None:
        self.batches: list[list[str]] = []
        self.gates: list[asyncio.Event] = []
        self.overlaps = overlaps  # as on a GPU unless told

    async def run(
        self, texts: list[str], *, pad_to: int | None = None, rows: int | None = None
    ) -> BatchOutcome:
        self.batches.append(list(texts))
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        outcomes = [Outcome(prediction=Prediction(embedding=[1.0])) for _ in texts]
        return BatchOutcome(outcomes=outcomes, batch_size=len(texts))

    def busy_fraction(self) -> float:
        return 0.0

    def tokenize_ms(self) -> float | None:
        return 2.0


async def _until(check: Callable[[], bool]) -> bool:
    for _ in range(500):
        if check():
            return True
        await asyncio.sleep(0.01)
    return False


async def _idle_turns() -> None:
    """Let the batch loop run a while (it would act now if it were going to)."""
    for _ in range(30):
        await asyncio.sleep(0.005)


async def _handover(handover_ms: float, late_ms: int, *, overlaps: bool = True) -> tuple[int, int]:
    """Batch 1 is predicted to take 100 ms; batch 2 waits, full, in the scheduler.

    Returns how many batches the engine had at fake times 80 ms and ``late_ms``,
    batch 1 still running both times.
    """
    now = [0]

    async def send(topic: str, key: bytes | None, value: bytes) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def ack(token: Any) -> None:
        pass

    s = Settings.from_env(
        {
            "PIPELINE_SCHEDULER_MAX_ITEMS": "2",
            "PIPELINE_SCHEDULER_LATENCY_OVERHEAD_MS": "100",
            "PIPELINE_SCHEDULER_LATENCY_MS_PER_TOKEN": "0",
            "PIPELINE_SCHEDULER_HANDOVER_MS": str(handover_ms),
            # The clock here stands still: a full batch after a wake must not wait out
            # the wake hold (issue 31), which is not what these tests time.
            "PIPELINE_SCHEDULER_WAKE_HOLD_MS": "0",
        }
    )
    engine = HeldEngine(overlaps=overlaps)
    runtime = Runtime(
        s,
        engine=engine,  # type: ignore[arg-type]
        publisher=Publisher(send, results_topic="res", dlq_topic="dlq"),
        ack=ack,
        clock_ms=lambda: now[0],
    )
    batches = asyncio.ensure_future(runtime.run())

    async def take(offset: int) -> None:
        _rid, value = request_bytes(f"text {offset}", request_id=f"r-{offset}")
        origin = Origin("lane.standard", 0, offset, 0, None, value)
        await submit(runtime, Incoming(lane="standard", origin=origin, token=offset))

    try:
        for offset in range(2):
            await take(offset)
        assert await _until(lambda: len(engine.batches) == 1)
        for offset in range(2, 4):
            await take(offset)
        now[0] = 80  # 20 ms left: more than the lead (handover_ms + 2 ms of tokenising)
        await _idle_turns()
        early = len(engine.batches)
        now[0] = late_ms
        await _until(lambda: len(engine.batches) == 2)
        await _idle_turns()
        late = len(engine.batches)
        assert not engine.gates[0].is_set()
        for gate in engine.gates:
            gate.set()
        assert await _until(lambda: len(engine.batches) == 2)
        for gate in engine.gates:
            gate.set()
    finally:
        batches.cancel()
        await runtime.close(1.0)
    return early, late


def test_next_batch_is_handed_over_within_the_lead_not_earlier() -> None:
    # Lead 10 + 2 ms: batch 2 is formed once batch 1 is predicted to end within 12 ms.
    assert asyncio.run(_handover(10.0, late_ms=90)) == (1, 2)


def test_negative_handover_forms_the_next_batch_only_after_the_running_one() -> None:
    assert asyncio.run(_handover(-1.0, late_ms=10_000)) == (1, 1)


def test_an_engine_that_gains_nothing_from_overlap_runs_one_batch_at_a_time() -> None:
    # A CPU engine: the same lead as above, but batch 2 waits for batch 1 to end.
    assert asyncio.run(_handover(10.0, late_ms=90, overlaps=False)) == (1, 1)
