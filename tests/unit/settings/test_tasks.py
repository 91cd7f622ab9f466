"""Tasks as data: each task defined once, asked by name."""

from __future__ import annotations

import pytest

from pipeline.errors import ConfigurationError
from pipeline.settings import ModelSettings
from pipeline.settings.tasks import DEFINITIONS, TASKS, task_of


def test_every_task_is_complete_and_the_default_is_first() -> None:
    assert ModelSettings().task == TASKS[0] == "embed"
    for task in DEFINITIONS:
        assert task_of(task.name) is task
        assert task.result_fields in {("embedding",), ("label", "score")}
        assert (task.output is None) == (task.auto_class is None) == (not task.runs_model)
    assert [t.name for t in DEFINITIONS if not t.runs_model] == ["noop"]
    assert [t.name for t in DEFINITIONS if not t.embeds] == ["classify"]


def test_an_unknown_task_names_the_setting_and_the_choices() -> None:
    with pytest.raises(ConfigurationError, match=r"PIPELINE_MODEL_TASK='rank'.*embed, classify"):
        task_of("rank")
    assert ModelSettings(task="noop", name="").display_name == "noop"
