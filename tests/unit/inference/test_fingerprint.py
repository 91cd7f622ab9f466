"""The model fingerprint: every change to a model's files or to what shapes its answer
gives another fingerprint, so stored answers of the old model are never served."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tiny_model import build_tiny_bert

from pipeline.inference import fingerprint, load_model
from pipeline.inference.fingerprint import files_digest, model_fingerprint
from pipeline.settings import Settings


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return build_tiny_bert(tmp_path / "model")


def _rewrite_keeping_size_and_mtime(path: Path, data: bytes) -> None:
    st = path.stat()
    assert len(data) == st.st_size
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_files_digest_is_stable_and_sees_any_content_change(folder: Path) -> None:
    first = files_digest(folder)
    assert files_digest(folder) == first
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one byte of the weights, same size, same mtime
    _rewrite_keeping_size_and_mtime(weights, bytes(data))
    changed = files_digest(folder)
    assert changed != first
    (folder / "extra.txt").write_text("a new file")
    assert files_digest(folder) != changed
    (folder / ".hidden").write_text("ignored")
    (folder / "extra.txt").unlink()
    assert files_digest(folder) == changed


def test_files_past_the_content_limit_are_told_apart_by_size_and_mtime(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fingerprint, "CONTENT_LIMIT", 0)
    first = files_digest(folder)
    weights = folder / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert files_digest(folder) != first


def test_everything_that_shapes_the_answer_changes_the_fingerprint(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = {
        "model_id": "m@1",
        "task": "embed",
        "max_length": 128,
        "device_type": "cpu",
        "folder": folder,
    }
    first = model_fingerprint(**base)  # type: ignore[arg-type]
    assert model_fingerprint(**base) == first  # type: ignore[arg-type]
    changes = {
        "model_id": "m@2",
        "task": "classify",
        "max_length": 64,
        "device_type": "cuda",
        "folder": None,
    }
    seen = {first}
    for name, value in changes.items():
        other = model_fingerprint(**{**base, name: value})  # type: ignore[arg-type]
        assert other not in seen, name
        seen.add(other)
    monkeypatch.setattr(fingerprint, "_version", lambda package: f"{package} upgraded")
    assert model_fingerprint(**base) not in seen  # type: ignore[arg-type]


def test_new_weights_at_the_same_path_give_other_dedupe_keys(folder: Path) -> None:
    settings = Settings.from_env(
        {
            "PIPELINE_MODEL_PATH": str(folder),
            "PIPELINE_MODEL_TRACE": "off",
            "PIPELINE_MODEL_PROCESS": "off",
        }
    ).model
    old = load_model(settings).keys("good movie")
    assert load_model(settings).keys("good movie") == old
    build_tiny_bert(folder, seed=1)
    assert load_model(settings).keys("good movie") != old
