"""``pipeline kafka up|down|status``: a local single-node broker for development and tests."""

from __future__ import annotations

import click

from pipeline.settings import Settings
from pipeline.tools.kafka_local import LocalKafka

__all__ = ["kafka_group"]


def _local_kafka(settings: Settings, port: int | None, data_dir: str | None) -> LocalKafka:
    import dataclasses as dc

    local = settings.local_kafka
    if port is not None:
        local = dc.replace(local, port=port)
    if data_dir is not None:
        local = dc.replace(local, data_dir=data_dir)
    return LocalKafka(local)


_kafka_port_option = click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Client port (default: PIPELINE_LOCAL_KAFKA_PORT; controller uses port + 1).",
)
_kafka_data_option = click.option(
    "--data-dir", default=None, help="Broker folder (default: PIPELINE_LOCAL_KAFKA_DATA_DIR)."
)


@click.group("kafka")
def kafka_group() -> None:
    """Run a local single-node Apache Kafka broker (KRaft, no Docker; needs java 17+, mvn)."""


@kafka_group.command("up")
@_kafka_port_option
@_kafka_data_option
@click.pass_obj
def kafka_up(settings: Settings, port: int | None, data_dir: str | None) -> None:
    """Start the broker in the background (idempotent) and print its bootstrap address."""
    import time as _time

    broker = _local_kafka(settings, port, data_dir)
    started = _time.monotonic()
    if not broker.has_jars():
        click.echo(f"resolving Kafka {broker.settings.version} jars (first run only)...", err=True)
    bootstrap = broker.up()
    elapsed = _time.monotonic() - started
    click.echo(bootstrap)
    click.echo(
        f"Kafka {broker.settings.version} ready at {bootstrap} in {elapsed:.1f} s "
        f"(pid {broker.read_pid()}, log {broker.log_file})",
        err=True,
    )


@kafka_group.command("down")
@_kafka_port_option
@_kafka_data_option
@click.option(
    "--timeout",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds to wait after SIGTERM before SIGKILL.",
)
@click.pass_obj
def kafka_down(settings: Settings, port: int | None, data_dir: str | None, timeout: float) -> None:
    """Stop the broker (SIGTERM, a clean shutdown; SIGKILL after --timeout)."""
    import time as _time

    broker = _local_kafka(settings, port, data_dir)
    started = _time.monotonic()
    if broker.down(timeout=timeout):
        click.echo(
            f"stopped the broker of {broker.data_dir} in {_time.monotonic() - started:.1f} s"
        )
    else:
        click.echo(f"no broker was running from {broker.data_dir}")


@kafka_group.command("status")
@_kafka_port_option
@_kafka_data_option
@click.pass_obj
def kafka_status(settings: Settings, port: int | None, data_dir: str | None) -> None:
    """Print the broker's state as JSON (running, pid, bootstrap, data_dir, version).

    Exits 1 when the broker is not running, so scripts can test it.
    """
    import json as _json

    state = _local_kafka(settings, port, data_dir).status()
    click.echo(_json.dumps(state, indent=2))
    if not state["running"]:
        raise click.exceptions.Exit(1)
