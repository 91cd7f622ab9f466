"""``pipeline replay-dlq``: flags in, ``pipeline.tools.replay.replay`` called, a report out."""

from __future__ import annotations

from typing import TextIO

import click

from pipeline.errors import STAGES
from pipeline.settings import LANES, Settings
from pipeline.tools.commands.options import (
    bootstrap_option,
    connect_timeout_option,
    epoch_ms,
    with_bootstrap,
)

__all__ = ["replay_dlq"]


@click.command("replay-dlq")
@bootstrap_option
@click.option("--dlq", default=None, help="Dead-letter topic (default: PIPELINE_TOPICS_DLQ).")
@click.option(
    "--from-offset",
    type=click.IntRange(0),
    default=None,
    help="Start at this offset in every partition (default: the beginning).",
)
@click.option(
    "--from-time",
    callback=epoch_ms,
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
    type=click.Choice(STAGES),
    help="Only dead letters of this stage (repeatable).",
)
@click.option("--error-class", default=None, help="Only error classes matching this glob.")
@click.option(
    "--topic", "topics", multiple=True, help="Only inputs of this original topic (repeatable)."
)
@click.option(
    "--since",
    callback=epoch_ms,
    default=None,
    help="Only dead letters that failed at/after this time (ISO 8601 or epoch ms).",
)
@click.option(
    "--until",
    callback=epoch_ms,
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
    help="Send every input to this topic (default: each one's original topic): a lane "
    f"name ({', '.join(LANES)}) or a topic name; PIPELINE_TOPICS_PREFIX is added "
    "unless the name already starts with it.",
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
@connect_timeout_option
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
    from pipeline.tools import replay as rp

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
        to_topic=None if to_topic is None else destination_topic(settings, to_topic),
        rate=rate,
        dry_run=dry_run,
        force=force,
        max_attempts=max_attempts,
        group=group,
        connect_timeout_s=connect_timeout,
    )
    target = with_bootstrap(settings, bootstrap)
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
    if report.gone:
        shown = ", ".join(report.gone[:10])
        click.echo(
            f"not replayed, the input is gone from its topic (retention or compaction; the "
            f"dead letter holds only its first bytes): {shown}",
            err=True,
        )
    if export_path is not None:
        click.echo(f"exported {report.exported} dead letters to {export_path}", err=True)
    click.echo(report.line(), err=True)


def destination_topic(settings: Settings, name: str) -> str:
    """``--to``'s topic: a lane's topic for a lane name, else ``name`` under the
    deployment's topic prefix (a name that already carries it is kept as it is)."""
    topics = settings.topics
    if name in LANES:
        return topics.lane_topic(name)
    return name if name.startswith(topics.prefix) else topics.prefix + name
