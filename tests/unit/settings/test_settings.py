"""Settings: one frozen object from PIPELINE_* variables, all documented."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipeline.errors import ConfigurationError
from pipeline.settings import Settings, describe


def test_defaults_and_overrides() -> None:
    s = Settings.from_env({})
    assert s.topics.lane_topic("realtime") == "inference.requests.realtime"
    s = Settings.from_env(
        {
            "PIPELINE_TOPICS_PREFIX": "dev.",
            "PIPELINE_SCHEDULER_MAX_ITEMS": "8",
            "PIPELINE_DEDUPE_ENABLED": "false",
        }
    )
    assert s.topics.results_topic == "dev.inference.results"
    assert s.scheduler.max_items == 8
    assert s.dedupe.enabled is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.scheduler.max_items = 3  # type: ignore[misc]


def test_typos_and_bad_values_are_clear_errors() -> None:
    with pytest.raises(ConfigurationError, match="PIPELINE_SCHEDULER_MAX_ITEM"):
        Settings.from_env({"PIPELINE_SCHEDULER_MAX_ITEM": "8"})
    with pytest.raises(ConfigurationError, match="expected a number"):
        Settings.from_env({"PIPELINE_SCHEDULER_MAX_ITEMS": "eight"})
    with pytest.raises(ConfigurationError, match="unknown lane"):
        Settings.from_env({}).topics.lane_topic("urgent")
    with pytest.raises(ConfigurationError, match="PIPELINE_KAFKA_FETCH_MAX_WAIT_MS=-1"):
        Settings.from_env({"PIPELINE_KAFKA_FETCH_MAX_WAIT_MS": "-1"})


def test_model_id_and_lane_expiry() -> None:
    s = Settings.from_env({"PIPELINE_WORKER_EXPIRE_LANES": "realtime, standard"})
    assert s.model.model_id == "all-MiniLM-L6-v2@1"
    assert s.worker.expires("standard") and not s.worker.expires("bulk")


def test_readme_lists_every_variable() -> None:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    missing = [var for var, _, _ in describe() if var not in readme]
    assert missing == []
