"""What every settings section shares: the variable prefix, field help."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

PREFIX = "PIPELINE_"
KAFKA_VERSION = "4.1.1"


def _default_cache() -> str:
    return str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pipeline")


def _field(default: Any, help: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help})
