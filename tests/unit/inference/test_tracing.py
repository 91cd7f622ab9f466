"""The traced network: same answers as the eager module, and a safety net when a
trace would be wrong.

Uses the bundled MiniLM (embed) and a tiny BERT built here (classify).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from support.predictions import floats
from tiny_model import build_tiny_bert

from pipeline.errors import ConfigurationError
from pipeline.inference import load_model
from pipeline.inference.tracing import TracedNetwork, traced
from pipeline.settings import ModelSettings

TEXTS = [
    "hi",
    "please reset the password of my account, the login keeps failing today",
    "refund " * 300,  # truncated at max_length
    "the delivery of my order is late",
]


def _embeddings(model: object, texts: list[str]) -> torch.Tensor:
    preds = model.predict(texts)  # type: ignore[attr-defined]
    return torch.tensor([floats(p) for p in preds])


@pytest.mark.slow  # loads the real MiniLM twice
def test_auto_traces_on_a_cpu_and_matches_eager() -> None:
    eager = load_model(ModelSettings(device="cpu", trace="off", process="off"))
    graph = load_model(ModelSettings(device="cpu", process="off"))
    assert isinstance(graph._network, TracedNetwork)  # type: ignore[union-attr]
    assert not isinstance(eager._network, TracedNetwork)  # type: ignore[union-attr]
    for batch in (TEXTS, TEXTS[:1], TEXTS[1:2] * 7):  # shapes the trace never saw
        want, got = _embeddings(eager, batch), _embeddings(graph, batch)
        assert want.shape == got.shape
        assert torch.allclose(want, got, atol=1e-5), float((want - got).abs().max())


def test_traced_classifier_gives_the_eager_labels(tmp_path: Path) -> None:
    folder = build_tiny_bert(tmp_path / "tiny")
    texts = ["good movie", "the film is very bad", "a film", "not good not bad very very good"]
    eager = load_model(ModelSettings(process="off", path=str(folder), task="classify", trace="off"))
    graph = load_model(ModelSettings(process="off", path=str(folder), task="classify", trace="on"))
    assert isinstance(graph._network, TracedNetwork)  # type: ignore[union-attr]
    for a, b in zip(eager.predict(texts), graph.predict(texts), strict=True):
        assert a.label == b.label
        assert a.score == pytest.approx(b.score, abs=1e-5)


class _ShapeDependent(torch.nn.Module):
    """A network a trace gets wrong: Python control flow on the input's shape."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, object]:
        hidden = input_ids.unsqueeze(-1).float() * attention_mask.unsqueeze(-1)
        if input_ids.shape[1] > 12:  # frozen at the sample's width when traced
            hidden = hidden * 2
        return {"last_hidden_state": hidden}


class _Tokenizer:
    def __call__(self, texts: list[str], **_: object) -> dict[str, torch.Tensor]:
        width = max(len(t.split()) for t in texts)
        ids = torch.zeros(len(texts), width, dtype=torch.long)
        mask = torch.zeros(len(texts), width, dtype=torch.long)
        for i, t in enumerate(texts):
            n = len(t.split())
            ids[i, :n] = torch.arange(1, n + 1)
            mask[i, :n] = 1
        return {"input_ids": ids, "attention_mask": mask}


def test_a_trace_that_differs_from_eager_is_refused() -> None:
    with pytest.raises(RuntimeError, match="differs from the eager module"):
        traced(_ShapeDependent(), _Tokenizer(), torch.device("cpu"), output="last_hidden_state")


class _NoHiddenState(torch.nn.Module):
    """Traces fine, but has no ``last_hidden_state`` for the check to compare."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, object]:
        return {"pooled": (input_ids * attention_mask).float()}


def test_a_trace_that_cannot_be_checked_is_refused() -> None:
    with pytest.raises(RuntimeError, match="checking the trace failed: KeyError"):
        traced(_NoHiddenState(), _Tokenizer(), torch.device("cpu"), output="last_hidden_state")


def test_load_model_falls_back_to_eager_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from pipeline.inference import tracing

    def refuse(*_: object, **__: object) -> TracedNetwork:
        raise RuntimeError("the trace differs from the eager module by 1.0e+00")

    monkeypatch.setattr(tracing, "traced", refuse)  # load_model imports it when it loads
    folder = build_tiny_bert(tmp_path / "tiny")
    with caplog.at_level(logging.WARNING, logger="pipeline.inference.loading"):
        model = load_model(
            ModelSettings(process="off", path=str(folder), task="classify", trace="on")
        )
    assert not isinstance(model._network, TracedNetwork)  # type: ignore[union-attr]
    assert "left eager" in caplog.text and "differs" in caplog.text
    assert len(model.predict(["good movie"])) == 1


def test_trace_setting_is_checked() -> None:
    with pytest.raises(ConfigurationError, match="PIPELINE_MODEL_TRACE='yes'"):
        ModelSettings(trace="yes")
