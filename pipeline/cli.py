"""The ``pipeline`` command. Thin: each command parses flags and calls library code.

This module owns the ``main`` group and ``pipeline settings``; the other
commands live in ``pipeline.tools.commands`` and are registered here,
so the console script ``pipeline.cli:main`` sees every command.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from pipeline.errors import PipelineError
from pipeline.settings import PREFIX, Settings, describe, suggest
from pipeline.tools.commands.answers import answers_cmd
from pipeline.tools.commands.bench import bench
from pipeline.tools.commands.dashboard import dashboard_group
from pipeline.tools.commands.kafka import kafka_group
from pipeline.tools.commands.produce import produce
from pipeline.tools.commands.replay import replay_dlq
from pipeline.tools.commands.topics import topics_group

__all__ = ["main"]


class _Group(click.Group):
    """Turns the pipeline's own errors into one clear line and exit status 1."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except PipelineError as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pipeline", prog_name="pipeline")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Kafka-native transformer inference.

    Settings come from PIPELINE_* environment variables (`pipeline settings`
    lists them); flags override them where a command offers one.
    """
    if ctx.invoked_subcommand == "settings":
        return  # it reports a misspelt variable itself, with the rest of the list
    ctx.obj = Settings.from_env()


@main.command("settings")
@click.option("--markdown", is_flag=True, help="Print a Markdown table (the README's).")
def settings_cmd(markdown: bool) -> None:
    """List every PIPELINE_* variable with the value in effect and its meaning.

    A variable set in the environment gets an "in effect:" line with its value
    (secrets as '***'); one that is not a setting is reported with the closest
    name, and the exit status is 1.
    """
    import os

    if markdown:
        click.echo("| variable | default | meaning |\n|---|---|---|")
        for var, default, help_ in describe():
            shown = default.replace(str(Path.home()), "~")
            click.echo(f"| `{var}` | `{shown}` | {help_} |")
        return
    known = {var for var, *_ in describe()}
    unknown = sorted(k for k in os.environ if k.startswith(PREFIX) and k not in known)
    in_effect = _values(Settings.from_env({k: v for k, v in os.environ.items() if k in known}))
    for var, default, help_ in describe():
        click.echo(f"{var}={default}")
        if var in os.environ:
            click.echo(f"    in effect: {in_effect[var]} (set in the environment)")
        click.echo(f"    {help_}")
    for var in unknown:
        click.echo(f"unknown setting {var}{suggest(var, known)}", err=True)
    if unknown:
        raise click.ClickException(f"{len(unknown)} unknown PIPELINE_* variable(s)")


def _values(settings: Settings) -> dict[str, str]:
    """``{variable: repr(value)}`` of every setting (secrets show as '***')."""
    out = {}
    for section in dataclasses.fields(settings):
        part = getattr(settings, section.name)
        for f in dataclasses.fields(part):
            out[f"{PREFIX}{section.name}_{f.name}".upper()] = repr(getattr(part, f.name))
    return out


main.add_command(kafka_group)
main.add_command(topics_group)
main.add_command(produce)
main.add_command(answers_cmd)
main.add_command(bench)
main.add_command(replay_dlq)
main.add_command(dashboard_group)
