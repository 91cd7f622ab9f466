"""The ``pipeline`` command. Thin: each command parses flags and calls library code.

This module owns the ``main`` group and the small commands (settings, topics,
produce); the larger ones live in ``pipeline.commands`` and are registered here,
so the console script ``pipeline.cli:main`` sees every command.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import click

from pipeline.commands.bench import bench
from pipeline.commands.dashboard import dashboard_group
from pipeline.commands.kafka import kafka_group
from pipeline.commands.options import bootstrap_option, with_bootstrap
from pipeline.commands.replay import replay_dlq
from pipeline.errors import ConfigurationError, PipelineError
from pipeline.settings import LANES, Settings, describe

__all__ = ["main"]


class _Group(click.Group):
    """Turns the pipeline's own errors into one clear line and exit status 1."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except PipelineError as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def main(ctx: click.Context) -> None:
    """Kafka-native transformer inference.

    Settings come from PIPELINE_* environment variables (`pipeline settings`
    lists them); flags override them where a command offers one.
    """
    ctx.obj = Settings.from_env()


@main.command("settings")
@click.option("--markdown", is_flag=True, help="Print a Markdown table (the README's).")
def settings_cmd(markdown: bool) -> None:
    """List every PIPELINE_* variable with its default and meaning."""
    if markdown:
        click.echo("| variable | default | meaning |\n|---|---|---|")
    for var, default, help_ in describe():
        if markdown:
            shown = default.replace(str(Path.home()), "~")
            click.echo(f"| `{var}` | `{shown}` | {help_} |")
        else:
            click.echo(f"{var}={default}\n    {help_}")


@main.group("topics")
def topics_group() -> None:
    """Create the pipeline's topics."""


@topics_group.command("create")
@bootstrap_option
@click.option(
    "--partitions",
    type=click.IntRange(1),
    default=None,
    help="Partitions per topic (default: PIPELINE_TOPICS_PARTITIONS).",
)
@click.option(
    "--replication",
    type=click.IntRange(1),
    default=None,
    help="Replication factor (default: PIPELINE_TOPICS_REPLICATION).",
)
@click.pass_obj
def topics_create(
    settings: Settings, bootstrap: str | None, partitions: int | None, replication: int | None
) -> None:
    """Create the three lane topics, the results topic and the dead-letter topic.

    Idempotent: existing topics are left alone (lane partition counts must match).
    """
    from pipeline.topics import create_topics

    status = create_topics(
        with_bootstrap(settings, bootstrap), partitions=partitions, replication=replication
    )
    for name, state in status.items():
        click.echo(f"{state:8} {name}")


def _parse_line(line: str, default_lane: str) -> dict[str, Any]:
    stripped = line.strip()
    if stripped.startswith("{"):
        obj = json.loads(stripped)
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise ValueError('a JSON line needs a "text" string')
        deadline = obj.get("deadline_ms")
        if deadline is None and obj.get("timeout_ms") is not None:
            deadline = int(time.time() * 1000) + int(obj["timeout_ms"])
        return {
            "text": obj["text"],
            "lane": obj.get("priority") or obj.get("lane") or default_lane,
            "request_id": obj.get("request_id"),
            "deadline_ms": None if deadline is None else int(deadline),
        }
    return {
        "text": line.rstrip("\n"),
        "lane": default_lane,
        "request_id": None,
        "deadline_ms": None,
    }


@main.command("produce")
@bootstrap_option
@click.option(
    "--lane",
    "-l",
    type=click.Choice(LANES),
    default="standard",
    show_default=True,
    help="Lane for lines that do not name one.",
)
@click.argument("source", type=click.File("r", encoding="utf-8"), default="-")
@click.pass_obj
def produce(settings: Settings, bootstrap: str | None, lane: str, source: TextIO) -> None:
    """Send texts from SOURCE (a file, or - for stdin) as inference requests.

    Each line is either plain text, or a JSON object with "text" and optional
    "priority" (realtime|standard|bulk), "request_id", "deadline_ms" (absolute
    epoch ms) or "timeout_ms" (relative). Blank lines are skipped. Prints one
    request_id per line sent; lines that cannot be parsed are reported and make
    the exit status 1, after the others were sent.
    """
    from tqdm import tqdm

    from pipeline.client import RequestProducer

    bad: list[str] = []
    sent = 0
    with RequestProducer(with_bootstrap(settings, bootstrap), source="pipeline produce") as p:
        lines = tqdm(source, unit=" req", disable=None, file=sys.stderr, desc="producing")
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                item = _parse_line(line, lane)
                rid = p.send(
                    item["text"],
                    lane=item["lane"],
                    request_id=item["request_id"],
                    deadline_ms=item["deadline_ms"],
                )
            except ConfigurationError:
                raise  # the settings or the broker, not this line: stop at once
            except (ValueError, PipelineError) as exc:
                bad.append(f"line {number}: {exc}")
                continue
            sent += 1
            click.echo(rid)
    click.echo(f"sent {sent} requests, all acknowledged", err=True)
    if bad:
        for msg in bad[:10]:
            click.echo(f"skipped {msg}", err=True)
        raise click.ClickException(f"{len(bad)} line(s) could not be sent")


main.add_command(kafka_group)
main.add_command(bench)
main.add_command(replay_dlq)
main.add_command(dashboard_group)
