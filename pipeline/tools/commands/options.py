"""Flags and helpers shared by more than one ``pipeline`` command."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import click

from pipeline.settings import Settings

__all__ = [
    "bootstrap_option",
    "connect_timeout_option",
    "epoch_ms",
    "keep_broker_option",
    "local_broker_unless",
    "seed_option",
    "with_bootstrap",
]


def with_bootstrap(settings: Settings, bootstrap: str | None) -> Settings:
    """``settings`` with ``--bootstrap`` applied, or unchanged when it was not given."""
    if not bootstrap:
        return settings
    return settings.replace(kafka=dataclasses.replace(settings.kafka, bootstrap_servers=bootstrap))


def epoch_ms(_ctx: click.Context, _param: click.Parameter, value: str | None) -> int | None:
    """Click callback: an ISO 8601 time (no zone = UTC) or epoch ms, as epoch ms."""
    from pipeline.tools.replay.plan import parse_time

    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@contextlib.contextmanager
def local_broker_unless(bootstrap: str | None, settings: Settings, *, keep: bool) -> Iterator[str]:
    """Yield ``bootstrap``, or without it the local broker's address.

    The local broker is started (or reused) as by ``pipeline kafka up``; on
    exit it is stopped if this call started it, unless ``keep``. Says on
    stderr what it does with the broker.
    """
    if bootstrap:
        yield bootstrap
        return
    from pipeline.tools.kafka_local import LocalKafka

    broker = LocalKafka(settings.local_kafka)
    was_running = bool(broker.status()["running"])
    click.echo("==> local broker " + ("reused" if was_running else "starting"), err=True)
    address = broker.up()
    try:
        yield address
    finally:
        if not was_running and not keep:
            click.echo("==> stopping the local broker", err=True)
            broker.down()


bootstrap_option = click.option(
    "--bootstrap",
    "-b",
    default=None,
    help="Kafka bootstrap servers (default: PIPELINE_KAFKA_BOOTSTRAP_SERVERS).",
)
keep_broker_option = click.option(
    "--keep-broker", is_flag=True, help="Leave a local broker this command started running."
)
seed_option = click.option("--seed", type=int, default=7, show_default=True, help="Workload seed.")
#: 10 s, as the library's own connect timeouts (``RequestProducer``, ``create_topics``,
#: ``ReplayOptions``) and the README say.
connect_timeout_option = click.option(
    "--connect-timeout",
    type=click.FloatRange(0.1),
    default=10.0,
    show_default=True,
    help="Seconds to wait for the broker before giving up.",
)
