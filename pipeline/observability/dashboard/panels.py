"""The Grafana dashboard's panels as data: titles, units and PromQL, read from its JSON.

Promises:

- :func:`load_panels` returns the dashboard's graph panels (rows skipped) in
  the dashboard's order, or the ones named in ``titles`` in that order; an
  unknown title is a :class:`~pipeline.errors.ConfigurationError` that lists
  the known ones;
- :func:`promql` turns a target's expression into plain PromQL by giving the
  dashboard's variables the values Grafana would (``$__rate_interval``, and
  ``$instance``/``$lane`` as "All", i.e. ``.*``); a variable it does not know
  is an error, never sent to Prometheus;
- :func:`legend` fills a Grafana ``legendFormat`` (``{{lane}}``) from a
  series' labels, as Grafana does (a missing label becomes empty).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigurationError

__all__ = [
    "DASHBOARD_JSON",
    "DEFAULT_PANELS",
    "Panel",
    "Target",
    "grafana_rate_interval",
    "legend",
    "load_panels",
    "promql",
]

#: The dashboard Grafana provisions (``ops/grafana/dashboards``), in a source checkout.
DASHBOARD_JSON = Path(__file__).resolve().parents[3] / "ops/grafana/dashboards/pipeline.json"

#: The panels the README's picture shows: the seed's curves and the decisions that
#: flatten them (batch size, budget, queues, pausing, shedding, dead letters).
DEFAULT_PANELS: tuple[str, ...] = (
    "Request latency p50 / p95 / p99 by lane",
    "Device utilisation (GPU) and engine busy share",
    "Results per second by lane",
    "Queue depth by lane",
    "Batch size (requests)",
    "Token budget and padded tokens per batch",
    "Paused lanes (backpressure)",
    "Circuit breaker and load-shedding level",
    "Late answers and expirations by lane",
    "Dead letters by stage",
)

_VARIABLE = re.compile(r"\$(\{[A-Za-z_]+\}|[A-Za-z_]+)")
_LEGEND_LABEL = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


@dataclass(frozen=True)
class Target:
    """One query of a panel: its PromQL (with Grafana variables) and legend format."""

    ref: str
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """A graph panel: title, Grafana unit (``s``, ``percentunit``, ``reqps``, ...), queries."""

    id: int
    title: str
    unit: str
    targets: tuple[Target, ...]
    min: float | None = None
    max: float | None = None


def _panel(raw: Mapping[str, Any]) -> Panel:
    defaults = (raw.get("fieldConfig") or {}).get("defaults", {})
    targets = tuple(
        Target(
            ref=str(t.get("refId", "")), expr=str(t["expr"]), legend=str(t.get("legendFormat", ""))
        )
        for t in raw.get("targets", [])
        if t.get("expr")
    )
    lo, hi = defaults.get("min"), defaults.get("max")
    return Panel(
        id=int(raw["id"]),
        title=str(raw["title"]),
        unit=str(defaults.get("unit", "short")),
        targets=targets,
        min=None if lo is None else float(lo),
        max=None if hi is None else float(hi),
    )


def load_panels(path: Path = DASHBOARD_JSON, titles: Sequence[str] | None = None) -> list[Panel]:
    """The graph panels of the dashboard at ``path`` (all, or those titled ``titles``)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigurationError(
            f"dashboard {path} not found; pass the Grafana dashboard JSON "
            "(ops/grafana/dashboards/pipeline.json in a source checkout)"
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"dashboard {path} is not JSON: {exc}") from exc
    panels = [_panel(p) for p in data.get("panels", []) if p.get("type") != "row"]
    if titles is None:
        return panels
    by_title = {p.title: p for p in panels}
    unknown = [t for t in titles if t not in by_title]
    if unknown:
        known = "\n  ".join(by_title)
        raise ConfigurationError(f"no panel titled {unknown} in {path}; known:\n  {known}")
    return [by_title[t] for t in titles]


def grafana_rate_interval(step_s: float, scrape_interval_s: float) -> str:
    """``$__rate_interval`` as Grafana computes it: max(step + scrape, 4 x scrape)."""
    seconds = max(step_s + scrape_interval_s, 4 * scrape_interval_s)
    return f"{max(1, round(seconds))}s"


def promql(expr: str, *, rate_interval: str, instance: str = ".*", lane: str = ".*") -> str:
    """``expr`` with the dashboard's variables replaced (``instance``/``lane`` are regexes)."""
    values = {
        "__rate_interval": rate_interval,
        "__interval": rate_interval,
        "instance": instance,
        "lane": lane,
    }

    def sub(match: re.Match[str]) -> str:
        name = match.group(1).strip("{}")
        if name not in values:
            raise ConfigurationError(f"unknown dashboard variable ${name} in: {expr}")
        return values[name]

    return _VARIABLE.sub(sub, expr)


def legend(fmt: str, labels: Mapping[str, str]) -> str:
    """A series' legend: ``fmt`` with ``{{label}}`` filled, or its labels when ``fmt`` is empty."""
    if not fmt:
        shown = {k: v for k, v in labels.items() if k not in ("__name__", "job")}
        return ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) or "value"
    return _LEGEND_LABEL.sub(lambda m: labels.get(m.group(1), ""), fmt).strip()
