"""The model in a process of its own (pipeline/inference/process.py), with a real
(tiny) model in a real child process: the same answers as in the worker's own
process, one outcome per text, and a child that dies or hangs never hangs the
caller and is started again within its bound."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.predictions import floats

from pipeline.errors import ConfigurationError, InferenceError
from pipeline.inference import InferenceEngine, load_model
from pipeline.inference.model import Model
from pipeline.inference.process import ModelProcessError, RemoteModel
from pipeline.settings import ModelSettings

TEXTS = ["the movie is very good", "a bad film", "not good", "the films", "good"]


@pytest.fixture
def remote(tiny_dir: Path) -> Iterator[RemoteModel]:
    model = load_model(ModelSettings(path=str(tiny_dir), process="on", process_restarts=2))
    assert isinstance(model, RemoteModel)
    yield model
    model.close()


def _predict(model: RemoteModel | Model, texts: list[str]) -> list[list[float]]:
    return [floats(p) for p in model.forward(model.tokenize(texts))]


def test_answers_and_keys_match_the_model_in_this_process(
    tiny_dir: Path, remote: RemoteModel
) -> None:
    local = load_model(ModelSettings(path=str(tiny_dir), process="off"))
    assert isinstance(local, Model)
    assert remote.pid is not None and remote.pid != os.getpid()
    assert remote.fingerprint == local.fingerprint and remote.max_length == local.max_length
    for text in ("Good  movie", "the\tfilm", "[MASK] is bad"):
        assert remote.keys(text) == local.keys(text)
    got, want = _predict(remote, TEXTS), _predict(local, TEXTS)
    assert len(got) == len(TEXTS)
    for a, b in zip(got, want, strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    calls, forward_s, _wait = remote.timing.totals()
    assert calls == 1 and forward_s > 0


def test_classify_answers_labels_across_the_process(tiny_dir: Path) -> None:
    settings = ModelSettings(path=str(tiny_dir), task="classify", process="on")
    remote, local = load_model(settings), load_model(dataclasses.replace(settings, process="off"))
    assert isinstance(remote, RemoteModel)
    try:
        got = remote.forward(remote.tokenize(TEXTS))
        want = local.forward(local.tokenize(TEXTS))
        assert [p.label for p in got] == [p.label for p in want]
        assert [p.score for p in got] == pytest.approx([p.score for p in want], abs=1e-5)
    finally:
        remote.close()


def test_a_failing_text_fails_alone_through_the_engine(tiny_dir: Path) -> None:
    model = load_model(ModelSettings(path=str(tiny_dir), process="on", fail_on="poison"))
    assert isinstance(model, RemoteModel)
    engine = InferenceEngine(model)
    engine.start()
    try:
        texts = ["good movie", "poison", "a bad film"]
        outcome = asyncio.run(engine.run(texts))
    finally:
        engine.stop(10)
    assert [o.ok for o in outcome.outcomes] == [True, False, True]
    error = outcome.outcomes[1].error
    assert error is not None and "fault injection" in str(error)
    assert model.pid is None  # the engine's stop closed the child


def test_batches_tokenized_ahead_are_answered_to_their_own_callers_in_any_order(
    tiny_dir: Path, remote: RemoteModel
) -> None:
    """The child runs each batch the moment it is tokenized; a caller asking for a later
    batch first (a bisected half asks after the batch queued behind it) gets its own
    answer, and the earlier one is kept for its caller."""
    local = load_model(ModelSettings(path=str(tiny_dir), process="off"))
    assert isinstance(local, Model)
    first, second = TEXTS[:2], TEXTS[2:]
    a, b = remote.tokenize(first), remote.tokenize(second)
    got_b = [floats(p) for p in remote.forward(b)]
    got_a = [floats(p) for p in remote.forward(a)]
    for got, texts in ((got_a, first), (got_b, second)):
        want = _predict(local, texts)
        assert len(got) == len(texts)
        for x, y in zip(got, want, strict=True):
            assert x == pytest.approx(y, abs=1e-5)


def test_a_batch_counted_but_not_queued_is_forwarded_when_asked(remote: RemoteModel) -> None:
    enc = remote.tokenize(TEXTS, ahead=False)  # count_tokens' way: prepared, not run
    assert enc.n_tokens > len(TEXTS)
    assert len(remote.forward(enc)) == len(TEXTS)
    assert remote.timing.totals()[0] == 1


def test_a_batch_queued_ahead_is_counted_with_its_forward(
    tiny_dir: Path, remote: RemoteModel
) -> None:
    """Sent without waiting (one message each way per batch): its counts come with its
    answer, the same as the model in this process counts, and the engine reports them."""
    local = load_model(ModelSettings(path=str(tiny_dir), process="off"))
    assert isinstance(local, Model)
    want = local.tokenize(TEXTS)
    enc = remote.tokenize(TEXTS)
    assert enc.n_tokens == 0 and remote.tokenized is None
    remote.forward(enc)
    assert remote.tokenized is not None
    n_tokens, padded, seconds = remote.tokenized
    assert (n_tokens, padded) == (want.n_tokens, want.padded_tokens) and seconds > 0
    engine = InferenceEngine(remote)
    engine.start()
    try:
        outcome = asyncio.run(engine.run(TEXTS))
    finally:
        engine.stop(10)
    assert (outcome.n_tokens, outcome.padded_tokens) == (want.n_tokens, want.padded_tokens)
    # The handover's lead learns the child's tokenising time, not the send's, and the
    # batch reports it alone.
    assert remote.tokenized is not None
    assert engine.tokenize_ms() == pytest.approx(remote.tokenized[2] * 1000)
    assert outcome.tokenize_ms == pytest.approx(remote.tokenized[2] * 1000)


def test_a_batch_that_cannot_be_tokenized_ahead_fails_its_forward(remote: RemoteModel) -> None:
    """What tokenizing a batch sent ahead raised, its forward raises; the child lives on."""
    pid = remote.pid
    enc = remote.tokenize([TEXTS[0], 42])  # type: ignore[list-item]
    with pytest.raises(InferenceError, match="TypeError"):
        remote.forward(enc)
    assert remote.pid == pid
    assert len(_predict(remote, TEXTS)) == len(TEXTS)


def _dead(pid: int) -> None:
    """Wait until the killed child ``pid`` is gone (a zombie until the worker reaps it)."""
    for _ in range(200):
        try:
            if Path(f"/proc/{pid}/stat").read_text().split()[2] in "ZX":
                return
        except FileNotFoundError:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} did not die")


def test_a_batch_queued_in_a_process_that_died_fails_at_once(remote: RemoteModel) -> None:
    """A batch tokenized ahead in a child that has since died and been replaced is not
    waited for (its answer can never come): it fails at once, and the new child works."""
    first = remote.pid
    assert first is not None
    stale = remote.tokenize(TEXTS)
    os.kill(first, signal.SIGKILL)
    _dead(first)
    # Finds it dead, or its pipe closes: at the send, or (a batch sent ahead to a child
    # whose last threads are still exiting) when its answer never comes.
    with contextlib.suppress(InferenceError):
        remote.forward(remote.tokenize(TEXTS))
    fresh = remote.tokenize(TEXTS)  # in the child started again
    assert remote.pid not in (None, first)
    with pytest.raises(ModelProcessError, match="has ended"):
        remote.forward(stale)
    assert len(remote.forward(fresh)) == len(TEXTS)


def _after_death(model: RemoteModel) -> None:
    """The first call after a kill may fail (the pipe closes under it); the next works."""
    with contextlib.suppress(InferenceError):
        _predict(model, TEXTS)
    assert len(_predict(model, TEXTS)) == len(TEXTS)


def test_a_killed_process_fails_the_call_then_is_started_again(remote: RemoteModel) -> None:
    first = remote.pid
    assert first is not None
    enc = remote.tokenize(TEXTS)
    os.kill(first, signal.SIGKILL)
    with pytest.raises(InferenceError):
        remote.forward(enc)  # its prepared batch died with it
    _after_death(remote)
    assert remote.pid not in (None, first) and remote.restarts == 1


def test_restarts_are_bounded(remote: RemoteModel) -> None:
    for restart in (1, 2):  # process_restarts=2
        pid = remote.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        _after_death(remote)
        assert remote.restarts == restart
    pid = remote.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    errors = []
    for _ in range(2):
        with pytest.raises(ModelProcessError) as info:
            _predict(remote, TEXTS)
        errors.append(str(info.value))
    assert "PROCESS_RESTARTS" in errors[-1] and remote.restarts == 2


def test_a_hung_process_is_killed_after_the_timeout(tiny_dir: Path) -> None:
    model = load_model(ModelSettings(path=str(tiny_dir), process="on", process_timeout_s=1.0))
    assert isinstance(model, RemoteModel)
    try:
        pid = model.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        with pytest.raises(ModelProcessError, match="no answer within"):
            _predict(model, TEXTS)
        assert model.pid is None  # killed; the next call starts another
        assert len(_predict(model, TEXTS)) == len(TEXTS)
    finally:
        model.close()


def test_a_model_folder_that_cannot_load_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigurationError, match="cannot load model folder") as info:
        load_model(ModelSettings(path=str(tmp_path), process="on"))
    assert "\n" not in str(info.value)
