"""The ``pipeline`` command. Thin: each command parses flags and calls library code."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import click

from pipeline.errors import PipelineError
from pipeline.kafka_local import LocalKafka
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


def _with_bootstrap(settings: Settings, bootstrap: str | None) -> Settings:
    if not bootstrap:
        return settings
    return settings.replace(kafka=dataclasses.replace(settings.kafka, bootstrap_servers=bootstrap))


_bootstrap_option = click.option(
    "--bootstrap",
    "-b",
    default=None,
    help="Kafka bootstrap servers (default: PIPELINE_KAFKA_BOOTSTRAP_SERVERS).",
)


@main.group("topics")
def topics_group() -> None:
    """Create the pipeline's topics."""


@topics_group.command("create")
@_bootstrap_option
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
        _with_bootstrap(settings, bootstrap), partitions=partitions, replication=replication
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
@_bootstrap_option
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
    with RequestProducer(_with_bootstrap(settings, bootstrap), source="pipeline produce") as p:
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


@main.group("kafka")
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
    """Print the broker's state as JSON (running, pid, bootstrap, data_dir, version)."""
    import json as _json

    click.echo(_json.dumps(_local_kafka(settings, port, data_dir).status(), indent=2))


def _epoch_ms(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from pipeline.replay import parse_time

    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


@main.command("replay-dlq")
@_bootstrap_option
@click.option("--dlq", default=None, help="Dead-letter topic (default: PIPELINE_TOPICS_DLQ).")
@click.option(
    "--from-offset",
    type=click.IntRange(0),
    default=None,
    help="Start at this offset in every partition (default: the beginning).",
)
@click.option(
    "--from-time",
    callback=_epoch_ms,
    default=None,
    help="Start at the first dead letter written at/after this time (ISO 8601 or epoch ms).",
)
@click.option(
    "--from-group",
    is_flag=True,
    help="Start where --group last committed (the beginning where it never did).",
)
@click.option(
    "--group",
    default="pipeline-replay",
    show_default=True,
    help="Consumer group whose offsets record what was replayed.",
)
@click.option(
    "--stage",
    "stages",
    multiple=True,
    type=click.Choice(["decode", "validate", "infer", "expired", "publish"]),
    help="Only dead letters of this stage (repeatable).",
)
@click.option("--error-class", default=None, help="Only error classes matching this glob.")
@click.option(
    "--topic", "topics", multiple=True, help="Only inputs of this original topic (repeatable)."
)
@click.option(
    "--since",
    callback=_epoch_ms,
    default=None,
    help="Only dead letters that failed at/after this time (ISO 8601 or epoch ms).",
)
@click.option(
    "--until",
    callback=_epoch_ms,
    default=None,
    help="Only dead letters that failed before this time (ISO 8601 or epoch ms).",
)
@click.option(
    "--request-id", "request_ids", multiple=True, help="Only this request id (repeatable)."
)
@click.option(
    "--request-ids-file",
    type=click.File("r", encoding="utf-8"),
    default=None,
    help="Only the request ids in this file, one per line.",
)
@click.option("--dry-run", is_flag=True, help="Print a summary table; produce nothing.")
@click.option(
    "--export",
    "export_path",
    type=click.Path(dir_okay=False, allow_dash=True),
    default=None,
    help="Write the selection as JSON lines to FILE (- for stdout); produce nothing.",
)
@click.option(
    "--to",
    "to_topic",
    default=None,
    help="Send every input to this topic (default: each one's original topic).",
)
@click.option(
    "--rate",
    type=click.FloatRange(0),
    default=0.0,
    show_default=True,
    help="Records per second; 0 is unbounded.",
)
@click.option("--force", is_flag=True, help="Send again what an earlier replay already sent.")
@click.option(
    "--max-attempts",
    type=click.IntRange(1),
    default=5,
    show_default=True,
    help="Skip inputs already replayed this many times (counted from the headers).",
)
@click.option(
    "--connect-timeout",
    type=click.FloatRange(0.1),
    default=10.0,
    show_default=True,
    help="Seconds to wait for the broker before giving up.",
)
@click.pass_obj
def replay_dlq(
    settings: Settings,
    *,
    bootstrap: str | None,
    dlq: str | None,
    from_offset: int | None,
    from_time: int | None,
    from_group: bool,
    group: str,
    stages: tuple[str, ...],
    error_class: str | None,
    topics: tuple[str, ...],
    since: int | None,
    until: int | None,
    request_ids: tuple[str, ...],
    request_ids_file: TextIO | None,
    dry_run: bool,
    export_path: str | None,
    to_topic: str | None,
    rate: float,
    force: bool,
    max_attempts: int,
    connect_timeout: float,
) -> None:
    """Send dead letters through again: their original key and value, untouched.

    Reads the dead-letter topic up to its end offsets as they were at start,
    selects with the filters, skips what an earlier replay already sent (unless
    --force) and inputs replayed --max-attempts times, and commits --group's
    offsets only after the broker acknowledged the records sent.
    """
    from pipeline import replay as rp

    if sum([from_offset is not None, from_time is not None, from_group]) > 1:
        raise click.UsageError("use one of --from-offset, --from-time, --from-group")
    if since is not None and until is not None and until <= since:
        raise click.BadParameter("must be later than --since", param_hint="--until")
    start = rp.Start()
    if from_offset is not None:
        start = rp.Start("offset", from_offset)
    elif from_time is not None:
        start = rp.Start("time", from_time)
    elif from_group:
        start = rp.Start("group")
    ids: set[str] | None = set(request_ids) if request_ids else None
    if request_ids_file is not None:
        listed = {ln.strip() for ln in request_ids_file if ln.strip() and not ln.startswith("#")}
        ids = (ids or set()) | listed
    options = rp.ReplayOptions(
        start=start,
        filters=rp.Filters(
            stages=frozenset(stages),
            error_class=error_class,
            topics=frozenset(topics),
            since_ms=since,
            until_ms=until,
            request_ids=None if ids is None else frozenset(ids),
        ),
        dlq_topic=dlq,
        to_topic=to_topic,
        rate=rate,
        dry_run=dry_run,
        force=force,
        max_attempts=max_attempts,
        group=group,
        connect_timeout_s=connect_timeout,
    )
    target = _with_bootstrap(settings, bootstrap)
    if export_path is None:
        report = rp.replay(target, options)
    else:
        with click.open_file(export_path, "w", encoding="utf-8") as export:
            report = rp.replay(target, options, export=export)
    to_stdout = export_path != "-"
    if dry_run:
        click.echo(rp.format_summary(report.summary), err=not to_stdout)
        click.echo(
            f"would replay {report.outcomes[rp.SEND]}, already sent "
            f"{report.outcomes[rp.ALREADY_SENT]}, over --max-attempts "
            f"{report.outcomes[rp.EXHAUSTED]}",
            err=not to_stdout,
        )
    if report.missing_topics:
        click.echo(
            f"missing original topic(s): {', '.join(sorted(report.missing_topics))}", err=True
        )
    if report.exhausted:
        shown = ", ".join(report.exhausted[:10])
        click.echo(f"skipped, replayed {max_attempts} times already: {shown}", err=True)
    if export_path is not None:
        click.echo(f"exported {report.exported} dead letters to {export_path}", err=True)
    click.echo(report.line(), err=True)
