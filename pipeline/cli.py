"""The ``pipeline`` command. Thin: each command parses flags and calls library code."""

from __future__ import annotations

import click

from pipeline.errors import PipelineError
from pipeline.settings import Settings, describe

__all__ = ["main"]


class _Group(click.Group):
    """Turns the pipeline's own errors into one clear line and exit status 2."""

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
def settings_cmd() -> None:
    """List every PIPELINE_* variable with its default and meaning."""
    for var, default, help_ in describe():
        click.echo(f"{var}={default}\n    {help_}")
