"""The curves of a set of panels over a time range, fetched from Prometheus or a file.

:func:`fetch` runs every target of every panel through ``query_range`` (the
panel's PromQL with the dashboard's variables filled by
:func:`~pipeline.observability.dashboard.panels.promql`) and returns, per panel title, one
:class:`Series` per answered series, labelled with the target's legend
format. A target that matches nothing contributes no series; that is not an
error (the picture says "no data"). :func:`dump` and :func:`load` keep what
was fetched in a JSON file, so a picture can be redrawn without the run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigurationError
from pipeline.observability.dashboard.panels import Panel, legend, promql
from pipeline.observability.dashboard.prometheus import PrometheusClient
from pipeline.settings import LANES

__all__ = ["Curves", "Series", "dump", "fetch", "load"]


@dataclass(frozen=True)
class Series:
    """One curve: which of the panel's targets made it, its legend, labels and points
    ((epoch seconds, value); NaN where Prometheus had no value)."""

    target: int
    legend: str
    labels: dict[str, str]
    points: list[tuple[float, float]]


@dataclass(frozen=True)
class Curves:
    """What a picture needs: the time range, and the series per panel title."""

    start: float
    end: float
    step_s: float
    rate_interval: str
    series: dict[str, list[Series]]
    #: (start s, end s, name), seconds since ``start``: phases of the run, if known.
    phases: list[tuple[float, float, str]] = field(default_factory=list)


def fetch(
    client: PrometheusClient,
    panels: Sequence[Panel],
    *,
    start: float,
    end: float,
    step_s: float,
    rate_interval: str,
    instance: str = ".*",
    lane: str = ".*",
) -> Curves:
    """Every panel's series between ``start`` and ``end`` (epoch seconds)."""
    if end <= start:
        raise ConfigurationError(f"empty time range: start {start} is not before end {end}")
    out: dict[str, list[Series]] = {}
    for panel in panels:
        found: list[Series] = []
        for index, target in enumerate(panel.targets):
            expr = promql(target.expr, rate_interval=rate_interval, instance=instance, lane=lane)
            try:
                raw = client.query_range(expr, start, end, step_s)
            except ConfigurationError as exc:
                raise ConfigurationError(
                    f"panel {panel.title!r}, query {target.ref}: {exc}"
                ) from exc
            found += [
                Series(index, legend(target.legend, r.labels), r.labels, r.points) for r in raw
            ]
        out[panel.title] = sorted(found, key=_order)
    return Curves(start, end, step_s, rate_interval, out)


def _order(series: Series) -> tuple[int, int, str]:
    """Target order, then realtime, standard, bulk, then by legend."""
    lane = series.labels.get("lane", "")
    return (series.target, LANES.index(lane) if lane in LANES else len(LANES), series.legend)


def dump(curves: Curves, path: Path) -> Path:
    """Write ``curves`` as JSON (NaN as null) to ``path``."""

    def clean(value: Any) -> Any:
        if isinstance(value, float) and math.isnan(value):
            return None
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        return value

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(clean(asdict(curves)), separators=(",", ":")) + "\n", encoding="utf-8"
    )
    return path


def load(path: Path) -> Curves:
    """Read a file written by :func:`dump`."""
    try:
        data: Mapping[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        series = {
            title: [
                Series(
                    target=int(s["target"]),
                    legend=str(s["legend"]),
                    labels=dict(s["labels"]),
                    points=[
                        (float(t), float("nan") if v is None else float(v)) for t, v in s["points"]
                    ],
                )
                for s in items
            ]
            for title, items in data["series"].items()
        }
        return Curves(
            float(data["start"]),
            float(data["end"]),
            float(data["step_s"]),
            str(data["rate_interval"]),
            series,
            [(float(a), float(b), str(name)) for a, b, name in data.get("phases", [])],
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(
            f"{path}: not a series file written by --save-series ({exc})"
        ) from exc
