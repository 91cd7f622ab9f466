"""Draw panels' curves as one PNG: a grid of plots titled like the dashboard's.

Promises of :func:`figure` (and :func:`render`, its PNG bytes):

- one axes per panel, in the order given, titled with the panel's title and
  its unit; a shared time axis in seconds since ``curves.start``;
- seconds (``s``) on a log scale, ratios (``percentunit``) as percentages,
  rates (``reqps``) in requests per second; a panel's min/max are honoured;
- a lane keeps its colour in every panel; within a panel, a target's
  line style tells its series apart (p50 dotted, p95 dashed, p99 solid);
- a panel without any finite point is drawn with the words "no data";
- optional ``phases`` ((start s, end s, name), seconds since the start) are
  shaded behind every panel and named in the top row.

Matplotlib runs headless (Agg, no pyplot state).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any, TypedDict, Unpack

from pipeline.observability.dashboard.panels import Panel
from pipeline.observability.dashboard.series import Curves, Series

__all__ = ["Layout", "figure", "render"]

LANE_COLOURS = {"realtime": "tab:red", "standard": "tab:blue", "bulk": "tab:green"}
OTHER_COLOURS = ("tab:purple", "tab:orange", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")
STYLES = ("-", "--", ":", "-.")
# How a Grafana unit is shown: (suffix for the title, factor).
UNITS = {
    "s": ("s, log scale", 1.0),
    "percentunit": ("%", 100.0),
    "reqps": ("per second", 1.0),
    "short": ("", 1.0),
}
PHASE_SHADES = ("#f2f2f2", "#fde2e2", "#e5f0e0", "#e3ebf6")


def _styles(panel: Panel, series: Sequence[Series]) -> list[tuple[str, str]]:
    """(colour, line style) per series: lanes by colour, targets by style."""
    lane_targets = {s.target for s in series if s.labels.get("lane") in LANE_COLOURS}
    # Dashboard order p50, p95, p99: the last target (the tail) gets the solid line.
    order = list(reversed(STYLES[: len(panel.targets)]))
    keys: dict[tuple[int, str], str] = {}
    out = []
    for s in series:
        if s.target in lane_targets:
            colour = LANE_COLOURS.get(s.labels.get("lane", ""), "tab:grey")
            style = order[s.target % len(order)] if len(lane_targets) > 1 else "-"
        else:
            key = (s.target, s.legend)
            colour = keys.setdefault(key, OTHER_COLOURS[len(keys) % len(OTHER_COLOURS)])
            style = "-"
        out.append((colour, style))
    return out


def _finite(values: Sequence[float]) -> bool:
    return any(math.isfinite(v) for v in values)


def _draw(ax: object, panel: Panel, series: Sequence[Series], start: float) -> None:
    from matplotlib.axes import Axes

    assert isinstance(ax, Axes)
    suffix, factor = UNITS.get(panel.unit, (panel.unit, 1.0))
    ax.set_title(f"{panel.title} ({suffix})" if suffix else panel.title, fontsize=9)
    ax.grid(True, linewidth=0.4, alpha=0.6)
    ax.tick_params(labelsize=7)
    drawn = 0
    for s, (colour, style) in zip(series, _styles(panel, series), strict=True):
        xs = [t - start for t, _ in s.points]
        ys = [v * factor for _, v in s.points]
        if panel.unit == "s":
            ys = [v if v > 0 else math.nan for v in ys]
        if not _finite(ys):
            continue
        ax.plot(xs, ys, color=colour, linestyle=style, linewidth=1.2, label=s.legend)
        drawn += 1
    if drawn == 0:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", color="grey",
                fontsize=11, transform=ax.transAxes)  # fmt: skip
        return
    if panel.unit == "s":
        ax.set_yscale("log")
    lo = None if panel.min is None else panel.min * factor
    hi = None if panel.max is None else panel.max * factor * 1.04
    ax.set_ylim(bottom=lo, top=hi)
    if panel.unit != "s" and lo is None:
        ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


class Layout(TypedDict, total=False):
    """:func:`figure`'s keyword arguments, which :func:`render` passes on."""

    title: str
    caption: str
    phases: Sequence[tuple[float, float, str]] | None
    columns: int


def figure(
    panels: Sequence[Panel],
    curves: Curves,
    *,
    title: str = "",
    caption: str = "",
    phases: Sequence[tuple[float, float, str]] | None = None,
    columns: int = 2,
) -> Any:
    """The matplotlib Figure; ``phases`` default to the ones ``curves`` carries."""
    from matplotlib.figure import Figure

    if phases is None:
        phases = curves.phases
    rows = max(1, math.ceil(len(panels) / columns))
    fig = Figure(figsize=(8.5 * columns, 2.9 * rows + 1.0), layout="constrained")
    grid = fig.subplots(rows, columns, sharex=True, squeeze=False)
    cells = [ax for row in grid for ax in row]
    span = curves.end - curves.start
    for i, (ax, panel) in enumerate(zip(cells, panels, strict=False)):
        for k, (a, b, name) in enumerate(phases):
            ax.axvspan(a, b, color=PHASE_SHADES[k % len(PHASE_SHADES)], zorder=0, linewidth=0)
            if i < columns:
                ax.text((a + b) / 2, 1.0, name, transform=ax.get_xaxis_transform(),
                        ha="center", va="top", fontsize=7, color="dimgrey")  # fmt: skip
        _draw(ax, panel, curves.series.get(panel.title, []), curves.start)
        ax.set_xlim(0, span)
    for ax in cells[len(panels) :]:
        fig.delaxes(ax)
    for ax in cells[: len(panels)][-columns:]:
        ax.set_xlabel("seconds since start", fontsize=8)
        ax.xaxis.set_tick_params(labelbottom=True)
    if title:
        fig.suptitle(title, fontsize=12)
    if caption:
        fig.supxlabel(caption, fontsize=8, color="dimgrey")
    return fig


def render(
    panels: Sequence[Panel], curves: Curves, *, dpi: int = 100, **layout: Unpack[Layout]
) -> bytes:
    """The PNG of :func:`figure`, drawn with ``layout``."""
    fig = figure(panels, curves, **layout)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
