"""Flags and helpers shared by more than one ``pipeline`` command."""

from __future__ import annotations

import dataclasses

import click

from pipeline.settings import Settings

__all__ = ["bootstrap_option", "with_bootstrap"]


def with_bootstrap(settings: Settings, bootstrap: str | None) -> Settings:
    """``settings`` with ``--bootstrap`` applied, or unchanged when it was not given."""
    if not bootstrap:
        return settings
    return settings.replace(kafka=dataclasses.replace(settings.kafka, bootstrap_servers=bootstrap))


bootstrap_option = click.option(
    "--bootstrap",
    "-b",
    default=None,
    help="Kafka bootstrap servers (default: PIPELINE_KAFKA_BOOTSTRAP_SERVERS).",
)
