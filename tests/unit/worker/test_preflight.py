"""A worker with a bad setting stops before it joins its consumer group (issue 16, item 8).

Unit checks of :func:`pipeline.worker.preflight.preflight`. Real worker processes against
the real broker (each bad deployment exits non-zero with the setting named on its
last line, and the group never sees a member) are in tests/kafka/test_preflight_live.py.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from pipeline.errors import ConfigurationError
from pipeline.settings import Settings
from pipeline.tools.supervise import free_port
from pipeline.worker.preflight import preflight


def _settings(tmp_path: Path, **env: str) -> Settings:
    return Settings.from_env(
        {"PIPELINE_WORKER_DATA_DIR": str(tmp_path / "data"), "PIPELINE_MODEL_TASK": "noop"}
        | {"PIPELINE_WORKER_WEB_PORT": str(free_port()), "PIPELINE_METRICS_PORT": "0"}
        | env
    )


def test_a_good_deployment_passes(tmp_path: Path) -> None:
    preflight(_settings(tmp_path, PIPELINE_MODEL_TASK="embed"))


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"PIPELINE_MODEL_TASK": "summarise"}, "PIPELINE_MODEL_TASK"),
        ({"PIPELINE_MODEL_TASK": "embed", "PIPELINE_MODEL_PATH": "/x"}, "PIPELINE_MODEL_PATH"),
        ({"PIPELINE_MODEL_TASK": "embed", "PIPELINE_MODEL_DEVICE": "tpu"}, "MODEL_DEVICE"),
        ({"PIPELINE_BREAKER_FALLBACK_MODEL_PATH": "/nowhere"}, "FALLBACK_MODEL_PATH"),
    ],
)
def test_a_bad_setting_is_named(tmp_path: Path, env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        preflight(_settings(tmp_path, **env))
    assert named in str(err.value) and "\n" not in str(err.value)


def test_a_taken_port_and_an_unwritable_folder_are_named(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        with pytest.raises(ConfigurationError, match="PIPELINE_WORKER_WEB_PORT"):
            preflight(_settings(tmp_path, PIPELINE_WORKER_WEB_PORT=port))
        preflight(_settings(tmp_path, PIPELINE_WORKER_WEB_PORT=port), ports=False)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigurationError, match="PIPELINE_WORKER_DATA_DIR"):
        preflight(_settings(tmp_path, PIPELINE_WORKER_DATA_DIR=str(blocker / "data")))
