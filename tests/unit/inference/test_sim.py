"""The simulated device (pipeline/inference/sim.py): a benchmark instrument that keeps
the real tokenizer and padding, answers one float32 row per text, and counts its busy
time in one file shared by every process on the host."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from pipeline.errors import InferenceError
from pipeline.inference import load_model
from pipeline.inference.model import Model
from pipeline.inference.sim import PROFILES, SimDevice, SimModel, read_busy_s
from pipeline.inference.telemetry import SimTelemetry, telemetry_for
from pipeline.settings import ModelSettings
from pipeline.settings.serving import SIM_PROFILES


def _sim(tmp_path: Path, **changes: object) -> SimModel:
    settings = ModelSettings(device="sim", process="off", sim_file=str(tmp_path / "dev"))
    model = load_model(settings.__class__(**{**settings.__dict__, **changes}))
    assert isinstance(model, SimModel)
    return model


def test_every_profile_setting_has_a_profile() -> None:
    assert set(SIM_PROFILES) == set(PROFILES)
    assert PROFILES["eager"].launches > 100 > PROFILES["graphed"].launches > 1


def test_it_keeps_the_real_tokenizer_and_pads_to_buckets(tmp_path: Path) -> None:
    sim = _sim(tmp_path)
    real = load_model(ModelSettings(process="off"))
    assert isinstance(real, Model)
    assert sim.kind == "sim" and sim.accelerated and sim.padding == "bucket"
    texts = ["a short text", "a somewhat longer text than the first one is"]
    enc, want = sim.tokenize(texts, pad_to=32), real.tokenize(texts)
    assert enc.n_tokens == want.n_tokens
    assert enc.padded_tokens == 2 * 32  # padded up to the scheduler's bucket
    assert sim.keys("Hello   world") != real.keys("Hello   world")  # never shares results


def test_one_float32_row_per_text_and_the_device_time_counted(tmp_path: Path) -> None:
    sim = _sim(tmp_path, sim_profile="graphed")
    texts = ["one", "two words", "three words here"]
    enc = sim.tokenize(texts, pad_to=16)
    preds = sim.forward(enc)
    assert len(preds) == 3
    for p in preds:
        assert isinstance(p.embedding, bytes) and len(p.embedding) == 4 * PROFILES["graphed"].dim
        assert struct.unpack("<f", p.embedding[:4])[0] == 1.0
    profile = PROFILES["graphed"]
    device_s = profile.fixed_ms / 1e3 + profile.per_token_ns * enc.padded_tokens / 1e9
    assert read_busy_s(tmp_path / "dev") == pytest.approx(device_s, abs=1e-8)  # whole ns
    calls, forward_s, lock_wait_s = sim.timing.totals()
    assert calls == 1 and forward_s >= device_s and lock_wait_s is not None


def test_fault_injection_still_raises(tmp_path: Path) -> None:
    sim = _sim(tmp_path, fail_on="poison")
    with pytest.raises(InferenceError, match="fault injection"):
        sim.forward(sim.tokenize(["fine", "poison"]))


def test_devices_on_one_file_share_one_counter(tmp_path: Path) -> None:
    path = tmp_path / "shared"
    a, b = SimDevice(path), SimDevice(path)
    a.run(0.002)
    b.run(0.003)
    assert read_busy_s(path) == pytest.approx(0.005, abs=1e-8)
    assert read_busy_s(tmp_path / "none") == 0.0


def test_telemetry_reads_the_simulated_device(tmp_path: Path) -> None:
    sim = _sim(tmp_path)
    telemetry = telemetry_for(sim, tmp_path / "dev")
    assert isinstance(telemetry, SimTelemetry) and telemetry.available
    assert telemetry.utilisation() == 0.0  # the first reading starts the window
    telemetry.close()
    assert telemetry.sample() is None
