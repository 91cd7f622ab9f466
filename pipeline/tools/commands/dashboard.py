"""``pipeline dashboard panels|render|record``: the Grafana dashboard's curves as a PNG."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from pipeline.observability.dashboard.panels import (
    DASHBOARD_JSON,
    DEFAULT_PANELS,
    Panel,
    load_panels,
)
from pipeline.observability.dashboard.series import Curves
from pipeline.settings import Settings
from pipeline.tools.commands.options import (
    bootstrap_option,
    epoch_ms,
    keep_broker_option,
    local_broker_unless,
    seed_option,
)

__all__ = ["dashboard_group"]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(_ctx: click.Context, _param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    match = _DURATION.fullmatch(value.strip())
    if match is None:
        raise click.BadParameter("expected a duration like 90s, 15m or 2h")
    return float(match.group(1)) * _SECONDS[match.group(2)]


def _time(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    ms = epoch_ms(ctx, param, value)
    return None if ms is None else ms / 1000.0


_dashboard_option = click.option(
    "--dashboard",
    "dashboard_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DASHBOARD_JSON,
    show_default=True,
    help="The Grafana dashboard JSON whose panels are drawn.",
)
_panel_option = click.option(
    "--panel",
    "titles",
    multiple=True,
    help="A panel title to draw (repeatable; `pipeline dashboard panels` lists them). "
    "Default: latency, utilisation, throughput, queues, batch size, budget, pauses, "
    "shedding, expirations and dead letters. --panel all draws every panel.",
)
_out_option = click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("dashboard.png"),
    show_default=True,
    help="The PNG to write.",
)
_step_option = click.option(
    "--step",
    type=click.FloatRange(0.1),
    default=1.0,
    show_default=True,
    help="Seconds between points of query_range.",
)
_rate_option = click.option(
    "--rate-interval",
    default=None,
    help="What $__rate_interval becomes, e.g. 10s. Default: as Grafana computes it, "
    "max(step + scrape interval, 4 x scrape interval).",
)
_save_option = click.option(
    "--save-series",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the fetched curves as JSON (redraw later with render --series).",
)


_DRAWING_OPTIONS = (
    _dashboard_option,
    _panel_option,
    _step_option,
    _rate_option,
    _save_option,
    _out_option,
)


@dataclasses.dataclass(frozen=True)
class _Drawing:
    """The flags of both drawing commands: which panels, how sampled, where the PNG goes."""

    dashboard_path: Path
    titles: tuple[str, ...]
    step: float
    rate_interval: str | None
    save_series: Path | None
    out: Path

    def panels(self) -> list[Panel]:
        """The --panel titles' panels (--panel all: every one; none: the default set)."""
        if self.titles == ("all",):
            return load_panels(self.dashboard_path)
        return load_panels(self.dashboard_path, list(self.titles) or list(DEFAULT_PANELS))

    def write(self, panels: list[Panel], curves: Curves, *, title: str, caption: str) -> None:
        """Save the curves to --save-series when given, then draw the PNG to --out."""
        from pipeline.observability.dashboard import dump, render

        if self.save_series is not None:
            dump(curves, self.save_series)
        png = render(panels, curves, title=title, caption=caption)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_bytes(png)
        click.echo(f"wrote {self.out} ({len(png) // 1024} KiB)", err=True)


def _drawing_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add the drawing flags to ``command``, which gets them as one ``drawing`` argument."""

    @functools.wraps(command)
    def bundled(*args: Any, **kwargs: Any) -> None:
        flags = {f.name: kwargs.pop(f.name) for f in dataclasses.fields(_Drawing)}
        command(*args, drawing=_Drawing(**flags), **kwargs)

    decorated: Callable[..., None] = bundled
    for option in reversed(_DRAWING_OPTIONS):  # as if stacked above ``command`` in this order
        decorated = option(decorated)
    return decorated


@click.group("dashboard")
def dashboard_group() -> None:
    """Draw the Grafana dashboard's panels as a PNG from a real Prometheus.

    Each panel's PromQL is read from the dashboard JSON (ops/grafana/), run
    through Prometheus' /api/v1/query_range, and plotted with matplotlib:
    the same curves Grafana draws, without Grafana. `record` makes a real
    run to draw (needs the `prometheus` binary); `render` draws from a
    Prometheus you already run.
    """


@dashboard_group.command("panels")
@_dashboard_option
def panels_cmd(dashboard_path: Path) -> None:
    """List the dashboard's panels (title, unit) and their PromQL."""
    for panel in load_panels(dashboard_path):
        mark = "*" if panel.title in DEFAULT_PANELS else " "
        click.echo(f"{mark} {panel.title}  [{panel.unit}]")
        for target in panel.targets:
            click.echo(f"      {target.ref}: {target.expr}")
    click.echo("(* drawn by default)")


@dashboard_group.command("render")
@click.option(
    "--prometheus",
    "url",
    default="http://127.0.0.1:9090",
    show_default=True,
    help='Prometheus that scraped the workers (job="pipeline").',
)
@click.option(
    "--since",
    callback=_duration,
    default="15m",
    show_default=True,
    help="Draw this much time before --end (90s, 15m, 2h); ignored with --start.",
)
@click.option("--start", callback=_time, help="Start: ISO 8601 (no zone = UTC) or epoch ms.")
@click.option("--end", callback=_time, help="End: ISO 8601 (no zone = UTC) or epoch ms [now].")
@click.option(
    "--scrape-interval",
    type=click.FloatRange(0.1),
    default=5.0,
    show_default=True,
    help="Prometheus' scrape interval in seconds (only for the default --rate-interval).",
)
@click.option("--instance", default=".*", show_default=True, help="Regex for $instance.")
@click.option("--lane", default=".*", show_default=True, help="Regex for $lane.")
@click.option(
    "--series",
    "series_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Draw curves saved by --save-series instead of asking Prometheus.",
)
@click.option("--title", default="Pipeline dashboard", show_default=True, help="Figure title.")
@click.option("--caption", default="", help="A line under the figure (what run, what machine).")
@_drawing_options
def render_cmd(  # noqa: PLR0917  (one parameter per flag, as click passes them)
    url: str,
    since: float,
    start: float | None,
    end: float | None,
    scrape_interval: float,
    instance: str,
    lane: str,
    series_file: Path | None,
    title: str,
    caption: str,
    drawing: _Drawing,
) -> None:
    """Draw the dashboard's panels over a past time range from a running Prometheus.

    \b
    Examples:
      pipeline dashboard render --since 30m --out dash.png
      pipeline dashboard render --prometheus http://prom:9090 --start 2026-12-02T17:00:00 \\
          --end 2026-12-02T17:20:00 --step 5 --panel "Queue depth by lane"
      pipeline dashboard render --series run.json --out again.png   # no Prometheus needed
    """
    from pipeline.observability.dashboard import PrometheusClient, fetch, load
    from pipeline.observability.dashboard.panels import grafana_rate_interval

    panels = drawing.panels()
    if series_file is not None:
        curves = load(series_file)
    else:
        stop = end if end is not None else time.time()
        begin = start if start is not None else stop - since
        curves = fetch(
            PrometheusClient(url),
            panels,
            start=begin,
            end=stop,
            step_s=drawing.step,
            rate_interval=drawing.rate_interval
            or grafana_rate_interval(drawing.step, scrape_interval),
            instance=instance,
            lane=lane,
        )
    drawing.write(panels, curves, title=title, caption=caption)


@dashboard_group.command("record")
@bootstrap_option
@click.option("--healthy", type=click.FloatRange(1), default=40.0, show_default=True,
              help="Seconds of steady mixed traffic first.")  # fmt: skip
@click.option("--overload", type=click.FloatRange(1), default=40.0, show_default=True,
              help="Seconds of the overload phase (a burst, a faster stream).")  # fmt: skip
@click.option("--recovery", type=click.FloatRange(1), default=60.0, show_default=True,
              help="Seconds of steady traffic after the overload phase.")  # fmt: skip
@click.option("--rate", type=click.FloatRange(0.1), default=4.0, show_default=True,
              help="Requests/s of the steady mixed stream (open-loop Poisson).")  # fmt: skip
@click.option("--overload-rate", type=click.FloatRange(0.1), default=12.0, show_default=True,
              help="Requests/s of the stream during the overload phase.")  # fmt: skip
@click.option("--realtime-share", type=click.FloatRange(0, 1), default=0.25, show_default=True,
              help="Share of the stream on the realtime lane; the rest is 60 % standard, "
              "40 % bulk.")  # fmt: skip
@click.option("--burst", type=click.IntRange(0), default=800, show_default=True,
              help="Standard and bulk requests sent at once when the overload begins.")  # fmt: skip
@click.option("--queue-size", type=click.IntRange(1), default=128, show_default=True,
              help="The worker's PIPELINE_SCHEDULER_QUEUE_SIZE (small: a burst pauses lanes)."
              )  # fmt: skip
@seed_option
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the worker's data and logs and Prometheus' data "
              "[a temporary folder, removed afterwards].")  # fmt: skip
@keep_broker_option
@_drawing_options
@click.pass_obj
def record_cmd(  # noqa: PLR0917  (one parameter per flag, as click passes them)
    settings: Settings,
    bootstrap: str | None,
    healthy: float,
    overload: float,
    recovery: float,
    rate: float,
    overload_rate: float,
    realtime_share: float,
    burst: int,
    queue_size: int,
    seed: int,
    workdir: Path | None,
    keep_broker: bool,
    drawing: _Drawing,
) -> None:
    """Make a real run and draw it: worker, Prometheus, healthy → overload → recovery.

    Starts a real worker (its own topics on the broker, load shedding on), a
    Prometheus (the `prometheus` binary on PATH) scraping it every second, and
    plays seeded traffic: --healthy seconds at --rate, then --burst requests at
    once and --overload seconds at --overload-rate, then --recovery seconds at
    --rate; waits for every answer, then draws the panels. Without
    --bootstrap the local broker is started (or reused) as by `pipeline kafka
    up`, and stopped afterwards if this command started it. About 3-5 minutes
    with the defaults on 2 CPU cores.

    \b
    Examples:
      pipeline dashboard record --out docs/ops/dashboard.png
      pipeline dashboard record --healthy 10 --overload 10 --recovery 10 --burst 100
    """
    import shutil

    from pipeline.errors import ConfigurationError
    from pipeline.kafka.security import security_env
    from pipeline.observability.dashboard.prometheus import INSTALL_HINT
    from pipeline.observability.dashboard.record import Scenario, record

    if shutil.which("prometheus") is None:  # say so before a broker and a worker start
        raise ConfigurationError(f"`prometheus` is not on PATH; {INSTALL_HINT}")
    panels = drawing.panels()
    scenario = Scenario(
        healthy_s=healthy,
        overload_s=overload,
        recovery_s=recovery,
        rate=rate,
        overload_rate=overload_rate,
        realtime_share=realtime_share,
        burst=burst,
        queue_size=queue_size,
        seed=seed,
    )
    with (
        local_broker_unless(bootstrap, settings, keep=keep_broker) as address,
        _workdir(workdir) as work,
    ):
        run = record(
            address,
            panels,
            scenario,
            work,
            step_s=drawing.step,
            rate_interval=drawing.rate_interval,
            extra_env=security_env(settings),  # the worker connects as this command does
            say=lambda m: click.echo(f"==> {m}", err=True),
        )
    command = "pipeline dashboard " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    caption = (
        f"A real run on {os.cpu_count()} CPU cores shared with other work, "
        f"{_model(run.model)}; {run.sent} requests, {run.answered} answered "
        f"({run.dead_letters} dead letters); worker defaults except queue bound {queue_size}, "
        f"gauges every 1 s; Prometheus scraping every 1 s, rate window "
        f"{run.curves.rate_interval}.\n`{command}`"
    )
    title = "Pipeline dashboard: healthy → overload burst → recovery"
    drawing.write(panels, run.curves, title=title, caption=caption)


@contextlib.contextmanager
def _workdir(workdir: Path | None) -> Iterator[Path]:
    """``workdir``, or a temporary folder removed on exit."""
    if workdir is not None:
        yield workdir
        return
    with tempfile.TemporaryDirectory(prefix="pipeline-dash-") as tmp:
        yield Path(tmp)


def _model(info: dict[str, str]) -> str:
    device = info.get("device", "?")
    where = "on the CPU, no GPU" if device == "cpu" else f"on {device}"
    return f"{info.get('name', 'the model')} {where}"
