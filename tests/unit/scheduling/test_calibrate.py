"""Start-up calibration of the latency model, and the model's fit without size spread.

Unit tier: the real engine runs the tiny BERT; no broker.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
from tiny_model import build_tiny_bert

from pipeline.inference import InferenceEngine, load_model
from pipeline.scheduling import Controller
from pipeline.scheduling.budget import Shapes
from pipeline.scheduling.calibrate import SHAPES, calibrate, sample_text
from pipeline.scheduling.controller import LatencyModel
from pipeline.scheduling.tokens import estimate_tokens
from pipeline.settings import ModelSettings, SchedulerSettings


def test_batches_of_one_size_keep_the_cost_per_token() -> None:
    model = LatencyModel(overhead_ms=12.0, ms_per_token=0.2, alpha=0.2)
    for _ in range(10):  # single short requests, 32 padded tokens, 10 ms each
        model.observe(32, 10.0)
    # 10 ms = 3.6 ms overhead + 0.2 ms x 32: a 512-token batch is not predicted as cheap
    assert model.ms_per_token == pytest.approx(0.2)
    assert model.overhead_ms == pytest.approx(3.6)
    assert model.predict_ms(512) == pytest.approx(106.0)


def test_batches_cheaper_than_the_prior_cost_lower_it() -> None:
    model = LatencyModel(overhead_ms=12.0, ms_per_token=0.2, alpha=0.2)
    for _ in range(10):  # a fast device: 256 tokens in 8 ms
        model.observe(256, 8.0)
    assert model.overhead_ms == 0.0
    assert model.predict_ms(256) == pytest.approx(8.0)
    assert model.predict_ms(512) == pytest.approx(16.0)


def test_batches_of_different_sizes_fit_both_terms() -> None:
    model = LatencyModel(overhead_ms=12.0, ms_per_token=0.2, alpha=0.2)
    for _ in range(10):
        for tokens in (32, 128, 512):
            model.observe(tokens, 5.0 + 0.1 * tokens)
    assert model.overhead_ms == pytest.approx(5.0, abs=0.01)
    assert model.ms_per_token == pytest.approx(0.1, abs=1e-4)


def test_sample_texts_land_in_the_intended_bucket() -> None:
    for buckets in ((16, 32, 64, 128, 256), SchedulerSettings().buckets):
        _land_in_their_bucket(Shapes(buckets, 32))


def _land_in_their_bucket(shapes: Shapes) -> None:
    for _rows, tokens in SHAPES:
        text = sample_text(tokens, 3)
        estimate = estimate_tokens(text, 256)  # the worker's estimate at intake
        assert shapes.seq_index(estimate) == shapes.seq_index(tokens), (tokens, estimate)
    assert sample_text(24, 1) != sample_text(24, 2)


def test_calibration_runs_every_shape_twice_and_fits_the_model(tmp_path: Path) -> None:
    folder = build_tiny_bert(tmp_path / "tiny")
    engine = InferenceEngine(load_model(ModelSettings(process="off", path=str(folder))))
    settings = dataclasses.replace(SchedulerSettings(), latency_ms_per_token=5.0)
    controller = Controller(settings, slo_ms=200)
    shapes = Shapes(settings.buckets, settings.max_items)
    engine.start()
    try:
        measured = asyncio.run(calibrate(engine, controller, shapes))
    finally:
        engine.stop()
    # rows x the default bucket of 24 tokens (24) and of 100 (112)
    assert [tokens for tokens, _ms in measured] == [24, 96, 192, 384, 224, 448]
    assert engine.stats().batches == 2 * len(SHAPES)
    assert controller.model.samples == len(SHAPES)
    assert all(ms > 0 for _tokens, ms in measured)
    # The tiny model is far cheaper than the (absurd) prior of 5 ms a token: learned.
    assert controller.model.predict_ms(512) < 5.0 * 512
    assert controller.budget == settings.token_budget  # only the model learns
