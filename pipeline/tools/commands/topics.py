"""``pipeline topics create|list|describe``: the pipeline's five topics on the cluster."""

from __future__ import annotations

import json

import click

from pipeline.settings import Settings
from pipeline.tools.commands.options import bootstrap_option, connect_timeout_option, with_bootstrap

__all__ = ["topics_group"]


@click.group("topics")
def topics_group() -> None:
    """Create and inspect the pipeline's topics."""


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
@connect_timeout_option
@click.pass_obj
def topics_create(
    settings: Settings,
    bootstrap: str | None,
    partitions: int | None,
    replication: int | None,
    connect_timeout: float,
) -> None:
    """Create the three lane topics, the results topic and the dead-letter topic.

    Idempotent: existing topics are left alone (lane partition counts must
    match); one that has another partition count than asked gets a warning.
    """
    from pipeline.kafka.topics import create_topics, describe_topics

    target = with_bootstrap(settings, bootstrap)
    status = create_topics(
        target,
        partitions=partitions,
        replication=replication,
        connect_timeout_s=connect_timeout,
    )
    for name, state in status.items():
        click.echo(f"{state:8} {name}")
    wanted = partitions or target.topics.partitions
    for topic in describe_topics(target, connect_timeout_s=connect_timeout):
        if status.get(topic.name) == "exists" and topic.partitions != wanted:
            click.echo(
                f"warning: {topic.name} exists with {topic.partitions} partitions, not "
                f"{wanted}; it was left as it is",
                err=True,
            )


@topics_group.command("list")
@bootstrap_option
@connect_timeout_option
@click.pass_obj
def topics_list(settings: Settings, bootstrap: str | None, connect_timeout: float) -> None:
    """One line per pipeline topic: name, role, partitions (or "missing").

    Exits 1 when any is missing.
    """
    from pipeline.kafka.topics import describe_topics

    states = describe_topics(with_bootstrap(settings, bootstrap), connect_timeout_s=connect_timeout)
    for t in states:
        shown = f"{t.partitions} partitions" if t.exists else "missing"
        click.echo(f"{t.name}\t{t.role}\t{shown}")
    missing = [t.name for t in states if not t.exists]
    if missing:
        raise click.ClickException(
            f"{len(missing)} topic(s) missing; create them with `pipeline topics create`"
        )


@topics_group.command("describe")
@bootstrap_option
@connect_timeout_option
@click.pass_obj
def topics_describe(settings: Settings, bootstrap: str | None, connect_timeout: float) -> None:
    """Each pipeline topic as JSON: name, role, exists, partitions, replication,
    retention_ms. Exits 1 when any is missing."""
    from pipeline.kafka.topics import describe_topics

    states = describe_topics(with_bootstrap(settings, bootstrap), connect_timeout_s=connect_timeout)
    out = [
        {
            "name": t.name,
            "role": t.role,
            "exists": t.exists,
            "partitions": t.partitions,
            "replication": t.replication,
            "retention_ms": int(t.retention_ms) if t.retention_ms.lstrip("-").isdigit() else None,
        }
        for t in states
    ]
    click.echo(json.dumps(out, indent=2))
    if not all(t.exists for t in states):
        raise click.ClickException("some topics are missing; `pipeline topics create` makes them")
