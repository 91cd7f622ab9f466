"""The inference stage: model loading, embed/classify, the engine thread, bisection.

Unit tier: no broker. The real all-MiniLM-L6-v2 is loaded once per run (the
``minilm`` fixture, tests/conftest.py; tests using it are ``slow``); a tiny
BERT built in a temporary folder covers ``classify`` and fault injection cheaply.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.predictions import floats
from tiny_model import LABELS

from pipeline.errors import ConfigurationError, InferenceError
from pipeline.inference import (
    BatchOutcome,
    DeviceTelemetry,
    Encoded,
    EngineStopped,
    InferenceEngine,
    Prediction,
    default_model_path,
    load_model,
)
from pipeline.inference._sync import BusyTracker
from pipeline.inference.batch_tokenizer import BatchTokenizer
from pipeline.inference.model import Model
from pipeline.settings import ModelSettings

TEXTS = [
    "A man is eating food.",
    "Kafka is a distributed event log.",
    "The quick brown fox jumps over the lazy dog near the river bank at dawn.",
    "hi",
    "Transformers turn tokens into vectors; pooling turns vectors into one.",
]


def cosine(a: list[float], b: list[float]) -> float:
    ta, tb = torch.tensor(a), torch.tensor(b)
    return float(torch.nn.functional.cosine_similarity(ta, tb, dim=0))


# -- the real model --------------------------------------------------------


def test_half_precision_weights_stay_within_cosine_0999_of_float32(minilm: Model) -> None:
    """bf16 weights (the CUDA default, PIPELINE_MODEL_DTYPE=auto) answer within 0.999
    cosine of float32 on the test texts (checked here on the CPU, which computes bf16
    too), and never share stored results with float32 (the fingerprint covers it)."""
    half = load_model(ModelSettings(dtype="bfloat16", process="off"))
    assert isinstance(half, Model)
    assert half.fingerprint != minilm.fingerprint
    for a, b in zip(half.predict(TEXTS), minilm.predict(TEXTS), strict=True):
        assert cosine(floats(a), floats(b)) >= 0.999


def test_bundled_model_identity(minilm: Model) -> None:
    assert minilm.name == "all-MiniLM-L6-v2"
    assert minilm.version == "1"
    assert minilm.model_id == "all-MiniLM-L6-v2@1"
    assert minilm.task == "embed"
    assert minilm.device == torch.device("cpu")


def test_embeddings_match_direct_transformers(minilm: Model) -> None:
    import transformers

    path = default_model_path()
    tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    net = transformers.AutoModel.from_pretrained(path, local_files_only=True).eval()
    with torch.no_grad():
        batch = tok(TEXTS, padding=True, truncation=True, max_length=256, return_tensors="pt")
        hidden = net(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        pooled = (hidden * mask).sum(1) / mask.sum(1)
        expected = torch.nn.functional.normalize(pooled, dim=1).tolist()
    got = minilm.predict(TEXTS)
    assert len(got) == len(TEXTS)
    for pred, want in zip(got, expected, strict=True):
        assert pred.embedding is not None and pred.label is None and pred.score is None
        assert len(floats(pred)) == 384
        assert cosine(floats(pred), want) >= 0.999


def test_embeddings_match_sentence_transformers(minilm: Model) -> None:
    from sentence_transformers import SentenceTransformer  # a dev dependency

    st = SentenceTransformer(default_model_path(), device="cpu")
    expected = st.encode(TEXTS, convert_to_numpy=True)
    for pred, want in zip(minilm.predict(TEXTS), expected, strict=True):
        assert pred.embedding is not None
        assert cosine(floats(pred), want.tolist()) >= 0.999


def test_embeddings_are_unit_length(minilm: Model) -> None:
    for pred in minilm.predict(TEXTS):
        assert pred.embedding is not None
        assert abs(float(torch.tensor(floats(pred)).norm()) - 1.0) < 1e-4


def test_batch_equals_single(minilm: Model) -> None:
    batch = minilm.predict(TEXTS)
    for text, together in zip(TEXTS, batch, strict=True):
        (alone,) = minilm.predict([text])
        assert together.embedding is not None and alone.embedding is not None
        assert cosine(floats(together), floats(alone)) >= 0.999


def test_tokenize_counts_real_and_padded_tokens(minilm: Model) -> None:
    enc = minilm.tokenize(["hi", "a somewhat longer sentence than the first"])
    assert enc.texts == ["hi", "a somewhat longer sentence than the first"]
    longest = enc.tensors["input_ids"].shape[1]
    assert enc.padded_tokens == 2 * longest
    assert enc.n_tokens == minilm.count_tokens("hi") + longest
    assert minilm.count_tokens("hi") == 3  # [CLS] hi [SEP]
    assert 0.0 < enc.padding_ratio < 1.0


def test_truncation_at_max_length(minilm: Model) -> None:
    long_text = "word " * 1000
    assert minilm.count_tokens(long_text) == minilm.max_length == 256
    enc = minilm.tokenize([long_text])
    assert enc.tensors["input_ids"].shape == (1, 256)


@settings(max_examples=150, deadline=None)
@given(
    texts=st.lists(
        st.text(max_size=60)
        | st.text(alphabet="ab cé東😀\t\n.,!", max_size=600)
        | st.builds(lambda n: "word " * n, st.integers(200, 400)),
        min_size=1,
        max_size=12,
    )
)
def test_a_batch_tokenizes_as_transformers_own_call_does(minilm: Model, texts: list[str]) -> None:
    """The model encodes batches through the Rust backend (BatchTokenizer); the
    tensors must be transformers' own, byte for byte, for any batch of texts,
    including ones past max_length."""
    assert minilm._batch_tokenizer is not None  # the fast path is the one under test
    want = minilm._tokenizer(texts, padding="longest", truncation=True,
                             max_length=minilm.max_length, return_tensors="pt")  # fmt: skip
    got = minilm.tokenize(texts).tensors
    assert set(got) == {"input_ids", "token_type_ids", "attention_mask"}
    for name, tensor in got.items():
        assert tensor.dtype == want[name].dtype and torch.equal(tensor, want[name]), name


def test_a_tokenizer_the_backend_cannot_match_keeps_transformers_path(minilm: Model) -> None:
    """BatchTokenizer.of gives None, never a guess: for an object with no Rust
    backend, and for a tokenizer whose own call differs from its backend's (here
    one that appends " !" to every text before encoding it; its backend does not)."""
    assert BatchTokenizer.of(object(), 16) is None

    class Shouting:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        def __call__(self, texts: list[str], **kw: Any) -> Any:
            return self._inner([t.upper() + " !" for t in texts], **kw)

    assert BatchTokenizer.of(Shouting(minilm._tokenizer), 16) is None
    assert BatchTokenizer.of(minilm._tokenizer, 16) is not None


def test_classify_needs_a_trained_head() -> None:
    with pytest.raises(ConfigurationError, match="classification head"):
        load_model(ModelSettings(task="classify", process="off"))


# -- the tiny model: classify, fault injection -----------------------------


def test_classify_labels_and_scores(tiny_dir: Path) -> None:
    model = load_model(ModelSettings(process="off", path=str(tiny_dir), task="classify"))
    assert model.name == tiny_dir.name
    preds = model.predict(["the movie is very good", "bad film", "poison"])
    assert len(preds) == 3
    for pred in preds:
        assert pred.embedding is None
        assert pred.label in LABELS.values()
        assert pred.score is not None and 0.0 < pred.score <= 1.0
        assert pred.score >= 1.0 / len(LABELS) - 1e-6  # the top of a softmax


def test_explicit_name_and_version(tiny_dir: Path) -> None:
    model = load_model(ModelSettings(process="off", path=str(tiny_dir), name="tiny", version="7"))
    assert model.model_id == "tiny@7"
    (pred,) = model.predict(["good movie"])
    assert pred.embedding is not None and len(floats(pred)) == 16


def test_fail_on_isolates_failing_input(tiny_dir: Path) -> None:
    model = load_model(
        ModelSettings(process="off", path=str(tiny_dir), task="classify", fail_on="poison")
    )
    with pytest.raises(InferenceError):
        model.predict(["good", "poison"])
    texts = ["good movie", "bad", "the film", "a movie", "poison", "not good", "very bad", "is"]
    engine = InferenceEngine(model)
    engine.start()
    try:
        result = asyncio.run(engine.run(texts))
    finally:
        assert engine.stop(timeout=10)
    assert len(result.outcomes) == 8 and result.batch_size == 8
    failed = [i for i, o in enumerate(result.outcomes) if not o.ok]
    assert failed == [4]
    assert isinstance(result.outcomes[4].error, InferenceError)
    assert all(o.prediction is not None for i, o in enumerate(result.outcomes) if i != 4)
    assert result.failures == 1
    assert result.model_calls > 1  # the batch was bisected
    assert engine.stats().failures == 1 and engine.stats().items == 8


# -- loading errors ---------------------------------------------------------


def test_missing_folder_is_a_helpful_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist") as info:
        load_model(ModelSettings(process="off", path=str(tmp_path / "nope")))
    assert "PIPELINE_MODEL_PATH" in str(info.value)


def test_folder_without_config_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"no config\.json"):
        load_model(ModelSettings(process="off", path=str(tmp_path)))


def test_broken_folder_is_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ConfigurationError, match="cannot load model folder") as info:
        load_model(ModelSettings(process="off", path=str(tmp_path)))
    assert info.value.__cause__ is not None


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"task": "summarise"}, "PIPELINE_MODEL_TASK"),
        ({"device": "tpu"}, "PIPELINE_MODEL_DEVICE"),
        ({"fail_on": "("}, "PIPELINE_MODEL_FAIL_ON"),
        ({"max_length": 0}, "PIPELINE_MODEL_MAX_LENGTH"),
    ],
)
def test_bad_settings_are_configuration_errors(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        load_model(ModelSettings(**changes))  # type: ignore[arg-type]


# -- the engine, with a fake model -----------------------------------------


class FakeModel:
    """Embeds a text as [len(text)]; raises ValueError on texts containing 'bad'."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate
        self.entered = threading.Event()  # set once a batch is in forward()
        self.threads: set[str] = set()  # names of the threads forward ran on
        self.calls: list[list[str]] = []

    def tokenize(
        self, texts: list[str], *, pad_to: int | None = None, rows: int | None = None
    ) -> Encoded:
        longest = max(len(t) for t in texts)
        ids = torch.zeros((len(texts), longest), dtype=torch.long)
        return Encoded(list(texts), {"input_ids": ids}, sum(map(len, texts)), ids.numel())

    def forward(self, enc: Encoded) -> list[Prediction]:
        self.threads.add(threading.current_thread().name)
        self.calls.append(enc.texts)
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        if any("bad" in t for t in enc.texts):
            raise ValueError("bad input")
        return [Prediction(embedding=[float(len(t))]) for t in enc.texts]


def test_engine_runs_on_its_own_thread() -> None:
    fake = FakeModel()
    engine = InferenceEngine(fake)
    engine.start()

    async def main() -> tuple[str, BatchOutcome]:
        return threading.current_thread().name, await engine.run(["a", "bb"])

    try:
        loop_thread, result = asyncio.run(main())
    finally:
        engine.stop(timeout=10)
    assert fake.threads == {"inference"}
    assert loop_thread not in fake.threads
    assert [o.prediction for o in result.outcomes] == [
        Prediction(embedding=[1.0]),
        Prediction(embedding=[2.0]),
    ]
    assert result.n_tokens == 3 and result.padded_tokens == 4 and result.model_calls == 1


def test_time_a_forward_waited_behind_earlier_batches_is_not_its_own() -> None:
    """A model process runs batches queued ahead in order and says how long the last one
    waited behind the others (``queued_s``): the engine's inference time leaves it out,
    so the controller learns the device's cost, not the queue's."""

    class Queued(FakeModel):
        def forward(self, enc: Encoded) -> list[Prediction]:
            time.sleep(0.02)
            # Waited its whole time behind the others (more than the call took, even).
            self.queued_s = 60.0 if enc.texts == ["queued"] else 0.0
            return super().forward(enc)

    engine = InferenceEngine(Queued())
    engine.start()

    async def main() -> tuple[BatchOutcome, BatchOutcome]:
        return await engine.run(["alone"]), await engine.run(["queued"])

    try:
        alone, queued = asyncio.run(main())
    finally:
        engine.stop(timeout=10)
    assert alone.inference_ms >= 20.0
    assert queued.inference_ms == 0.0


def test_the_device_idle_time_before_each_batch_is_measured() -> None:
    """``idle_before_ms``: from the end of the engine's previous forward to this one's
    start, on the device's own clock where the model gives one (``device_span``: a
    model process's start and end in the child), else the forward call's."""

    class Spans(FakeModel):
        device_span: tuple[float, float] | None = None

        def forward(self, enc: Encoded) -> list[Prediction]:
            now = time.perf_counter()
            if enc.texts == ["late"]:  # the device started it 30 ms after it was asked
                self.device_span = (now + 0.030, now + 0.031)
            else:
                self.device_span = None
            return super().forward(enc)

    engine = InferenceEngine(Spans())
    engine.start()

    async def main() -> list[BatchOutcome]:
        first = await engine.run(["first"])
        await asyncio.sleep(0.05)  # the engine idles 50 ms
        return [first, await engine.run(["second"]), await engine.run(["late"])]

    try:
        first, second, late = asyncio.run(main())
    finally:
        engine.stop(timeout=10)
    assert first.idle_before_ms is None  # nothing ran before it
    assert second.idle_before_ms is not None and 45.0 <= second.idle_before_ms < 1000.0
    assert late.idle_before_ms is not None and late.idle_before_ms >= 29.0


def test_stop_joins_the_thread_and_refuses_new_work() -> None:
    engine = InferenceEngine(FakeModel())
    engine.start()
    thread = next(t for t in threading.enumerate() if t.name == "inference")
    assert not thread.daemon
    assert engine.stop(timeout=10)
    assert not thread.is_alive()
    assert engine.stop(timeout=1)  # idempotent
    with pytest.raises(EngineStopped):
        asyncio.run(engine.run(["x"]))


def test_bisect_wraps_foreign_errors() -> None:
    fake = FakeModel()
    engine = InferenceEngine(fake)
    engine.start()
    texts = ["ok1", "bad1", "ok2", "ok3", "bad2", "ok4"]
    try:
        result = asyncio.run(engine.run(texts))
    finally:
        engine.stop(timeout=10)
    assert [o.ok for o in result.outcomes] == [True, False, True, True, False, True]
    for outcome in result.outcomes:
        if not outcome.ok:
            assert isinstance(outcome.error, InferenceError)
            assert isinstance(outcome.error.__cause__, ValueError)
    assert all(len(call) > 0 for call in fake.calls)
    assert ["bad1"] in fake.calls and ["bad2"] in fake.calls


def test_bounded_queue_does_not_block_the_loop() -> None:
    gate = threading.Event()
    engine = InferenceEngine(FakeModel(gate), queue_size=2)
    engine.start()

    async def main() -> list[BatchOutcome]:
        jobs = [asyncio.create_task(engine.run([f"text {i}"])) for i in range(6)]
        ticks = 0
        for _ in range(20):  # the loop keeps turning while jobs wait for room
            await asyncio.sleep(0.005)
            ticks += 1
        assert ticks == 20 and not any(j.done() for j in jobs)
        gate.set()
        return await asyncio.wait_for(asyncio.gather(*jobs), timeout=10)

    try:
        results = asyncio.run(main())
    finally:
        engine.stop(timeout=10)
    assert [r.outcomes[0].ok for r in results] == [True] * 6
    assert engine.stats().batches == 6


def test_stop_without_drain_fails_queued_jobs() -> None:
    gate = threading.Event()
    fake = FakeModel(gate)
    engine = InferenceEngine(fake, queue_size=4)
    engine.start()

    async def main() -> list[BatchOutcome | BaseException]:
        jobs = [asyncio.create_task(engine.run([f"t{i}"])) for i in range(3)]
        # The first is in the model (held at the gate); the other two were
        # submitted behind it (each task ran up to its wait before this resumes).
        assert await asyncio.to_thread(fake.entered.wait, 10)
        # Stopped while the first still runs: threads still alive, so False.
        assert engine.stop(timeout=0, drain=False) is False
        gate.set()
        assert engine.stop(timeout=10)  # idempotent: now it joins the threads
        return await asyncio.gather(*jobs, return_exceptions=True)

    results = asyncio.run(main())
    assert isinstance(results[0], BatchOutcome) and results[0].outcomes[0].ok
    assert all(isinstance(r, EngineStopped) for r in results[1:])


def test_busy_fraction_over_a_sliding_window() -> None:
    now = [100.0]

    class SlowFake(FakeModel):
        def forward(self, enc: Encoded) -> list[Prediction]:
            now[0] += 2.0  # each batch takes two (fake) seconds
            return super().forward(enc)

    engine = InferenceEngine(SlowFake(), busy_window_s=10.0, clock=lambda: now[0])
    engine.start()
    try:
        asyncio.run(engine.run(["a"]))
        now[0] += 2.0
        assert engine.busy_fraction() == pytest.approx(0.5)  # 2 busy of 4 elapsed
        now[0] += 16.0  # the busy span slides out of the window
        assert engine.busy_fraction() == 0.0
    finally:
        engine.stop(timeout=10)


@given(
    st.lists(
        st.tuples(st.floats(0.0, 3.0), st.floats(0.0, 3.0), st.booleans()), min_size=1, max_size=40
    )
)
def test_busy_tracker_matches_a_direct_sum(steps: list[tuple[float, float, bool]]) -> None:
    """The running sum gives what summing every span clipped to the window gives."""
    now = [0.0]
    tracker = BusyTracker(5.0, lambda: now[0])
    spans: list[tuple[float, float]] = []
    for idle, busy, read in steps:
        now[0] += idle
        tracker.begin()
        start = now[0]
        now[0] += busy
        tracker.end()
        spans.append((start, now[0]))
        if read:
            low = now[0] - 5.0
            expected = sum(max(0.0, end - max(s, low)) for s, end in spans)
            wall = min(5.0, now[0])
            want = 0.0 if wall <= 0 else min(1.0, expected / wall)
            assert tracker.fraction() == pytest.approx(want, abs=1e-9)


def test_empty_batch_needs_no_thread() -> None:
    engine = InferenceEngine(FakeModel())
    result = asyncio.run(engine.run([]))
    assert result.outcomes == [] and result.batch_size == 0


def test_cancelled_caller_does_not_wedge_the_engine() -> None:
    gate = threading.Event()
    fake = FakeModel(gate)
    engine = InferenceEngine(fake, queue_size=1)
    engine.start()

    async def main() -> BatchOutcome:
        first = asyncio.create_task(engine.run(["first"]))
        waiting = [asyncio.create_task(engine.run([f"w{i}"])) for i in range(3)]
        assert await asyncio.to_thread(fake.entered.wait, 10)  # "first" is in the model
        for task in waiting:
            task.cancel()
        gate.set()
        await first
        return await asyncio.wait_for(engine.run(["after"]), timeout=5)

    try:
        result = asyncio.run(main())
    finally:
        engine.stop(timeout=10)
    assert result.outcomes[0].ok


def test_telemetry_is_none_on_cpu() -> None:
    telemetry = DeviceTelemetry("cpu")
    assert not telemetry.available
    assert telemetry.sample() is None
    assert telemetry.utilisation() is None
    telemetry.close()


def test_engine_runs_the_real_model_and_times_its_stages_within_the_call(
    minilm: Model,
) -> None:
    engine = InferenceEngine(minilm)
    engine.start()
    started = time.perf_counter()
    try:
        result = asyncio.run(engine.run(TEXTS))
    finally:
        engine.stop(timeout=30)
    elapsed_ms = (time.perf_counter() - started) * 1000
    # The engine's thread gives what the model gives when called directly.
    for outcome, direct in zip(result.outcomes, minilm.predict(TEXTS), strict=True):
        assert outcome.prediction is not None and outcome.prediction.embedding is not None
        assert direct.embedding is not None
        assert cosine(floats(outcome.prediction), floats(direct)) >= 0.999
    # Both stages were measured, and they happened inside the call.
    assert result.inference_ms > 0 and result.tokenize_ms > 0
    assert result.tokenize_ms + result.inference_ms <= elapsed_ms
