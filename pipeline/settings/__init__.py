"""One frozen settings object, read once from ``PIPELINE_*`` environment variables.

Each section is a frozen dataclass; a field ``FIELD`` of section ``SECTION`` is
read from ``PIPELINE_SECTION_FIELD`` (upper case). ``Settings.from_env()`` is
the only place in the package that reads ``os.environ``; everything else gets
the object passed down. ``pipeline settings`` prints every variable with its
default and help text, and the README lists them.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar, get_type_hints

from pipeline.errors import ConfigurationError
from pipeline.settings._fields import KAFKA_VERSION, PREFIX
from pipeline.settings.kafka import (
    KafkaSecuritySettings,
    KafkaSettings,
    LocalKafkaSettings,
    Secret,
    TopicSettings,
)
from pipeline.settings.lanes import LANES, Lane, lanes_of
from pipeline.settings.registry import RegistrySettings
from pipeline.settings.scheduling import BreakerSettings, DegradeSettings, SchedulerSettings
from pipeline.settings.serving import (
    BatchSettings,
    DedupeSettings,
    LogSettings,
    MetricsSettings,
    ModelSettings,
    RetrySettings,
    ValidationSettings,
    WorkerSettings,
)

__all__ = [
    "KAFKA_VERSION",
    "LANES",
    "PREFIX",
    "BatchSettings",
    "BreakerSettings",
    "DedupeSettings",
    "DegradeSettings",
    "KafkaSecuritySettings",
    "KafkaSettings",
    "Lane",
    "LocalKafkaSettings",
    "LogSettings",
    "MetricsSettings",
    "ModelSettings",
    "RegistrySettings",
    "RetrySettings",
    "SchedulerSettings",
    "Secret",
    "Settings",
    "TopicSettings",
    "ValidationSettings",
    "WorkerSettings",
    "lanes_of",
]

_SECTIONS: dict[str, type[Any]] = {
    "kafka": KafkaSettings,
    "kafka_security": KafkaSecuritySettings,
    "local_kafka": LocalKafkaSettings,
    "topics": TopicSettings,
    "validation": ValidationSettings,
    "model": ModelSettings,
    "batch": BatchSettings,
    "retry": RetrySettings,
    "dedupe": DedupeSettings,
    "worker": WorkerSettings,
    "metrics": MetricsSettings,
    "log": LogSettings,
    "scheduler": SchedulerSettings,
    "degrade": DegradeSettings,
    "breaker": BreakerSettings,
    "registry": RegistrySettings,
}

T = TypeVar("T")


def _coerce(name: str, raw: str, kind: Any) -> Any:
    if kind is bool:
        low = raw.strip().lower()
        if low in {"1", "true", "yes", "on"}:
            return True
        if low in {"0", "false", "no", "off", ""}:
            return False
        raise ConfigurationError(f"{name}={raw!r}: expected true or false")
    if kind is Secret:
        return Secret(raw)
    if kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            raise ConfigurationError(f"{name}={raw!r}: expected a number") from None
    return raw


def _load(cls: type[T], section: str, env: Mapping[str, str]) -> T:
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        var = f"{PREFIX}{section}_{f.name}".upper()
        if var in env:
            values[f.name] = _coerce(var, env[var], hints[f.name])
    return cls(**values)


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every setting of the pipeline, one frozen section per stage."""

    kafka: KafkaSettings = dataclasses.field(default_factory=KafkaSettings)
    kafka_security: KafkaSecuritySettings = dataclasses.field(default_factory=KafkaSecuritySettings)
    local_kafka: LocalKafkaSettings = dataclasses.field(default_factory=LocalKafkaSettings)
    topics: TopicSettings = dataclasses.field(default_factory=TopicSettings)
    validation: ValidationSettings = dataclasses.field(default_factory=ValidationSettings)
    model: ModelSettings = dataclasses.field(default_factory=ModelSettings)
    batch: BatchSettings = dataclasses.field(default_factory=BatchSettings)
    retry: RetrySettings = dataclasses.field(default_factory=RetrySettings)
    dedupe: DedupeSettings = dataclasses.field(default_factory=DedupeSettings)
    worker: WorkerSettings = dataclasses.field(default_factory=WorkerSettings)
    metrics: MetricsSettings = dataclasses.field(default_factory=MetricsSettings)
    log: LogSettings = dataclasses.field(default_factory=LogSettings)
    scheduler: SchedulerSettings = dataclasses.field(default_factory=SchedulerSettings)
    degrade: DegradeSettings = dataclasses.field(default_factory=DegradeSettings)
    breaker: BreakerSettings = dataclasses.field(default_factory=BreakerSettings)
    registry: RegistrySettings = dataclasses.field(default_factory=RegistrySettings)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read every section from ``env`` (default ``os.environ``); unknown
        ``PIPELINE_*`` variables raise, so a typo never goes unnoticed."""
        env = os.environ if env is None else env
        known = {var for var, *_ in describe()}
        unknown = sorted(k for k in env if k.startswith(PREFIX) and k not in known)
        if unknown:
            raise ConfigurationError(
                f"unknown setting(s) {', '.join(unknown)}{suggest(unknown[0], known)}; "
                "run `pipeline settings` for the list"
            )
        sections = {name: _load(cls_, name, env) for name, cls_ in _SECTIONS.items()}
        return cls(**sections)

    def replace(self, **sections: Any) -> Settings:
        """A copy with whole sections swapped, e.g. ``s.replace(kafka=...)``."""
        return dataclasses.replace(self, **sections)


def suggest(name: str, known: Iterable[str]) -> str:
    """`` (did you mean X?)`` for the known setting closest to ``name``, or ``""``."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def describe() -> Iterator[tuple[str, str, str]]:
    """Yield ``(variable, default, help)`` for every setting, in section order."""
    for section, cls in _SECTIONS.items():
        for f in dataclasses.fields(cls):
            yield f"{PREFIX}{section}_{f.name}".upper(), repr(f.default), f.metadata["help"]
