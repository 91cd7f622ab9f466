"""``pipeline answers``: results and dead letters, one line each, for a person or a script."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import click

from pipeline.kafka.reader import Answer, Start
from pipeline.settings import LANES, Settings
from pipeline.tools.commands.options import bootstrap_option, epoch_ms, with_bootstrap

__all__ = ["answer_json", "answer_line", "answers_cmd"]


def _lane(settings: Settings, topic: str) -> str:
    for lane in LANES:
        if settings.topics.lane_topic(lane) == topic:
            return lane
    return topic


def answer_line(settings: Settings, answer: Answer) -> str:
    """One table line: request id, lane, served (or "dead-letter"), latency, and the
    label and score, the first embedding values, or the dead letter's stage and error."""
    r = answer.record
    rid = answer.request_id or "-"
    if answer.kind == "dead_letter":
        lane = _lane(settings, r["original_topic"])
        error = f"{r['stage']}: {r['error_class']}: {r['error_message']}"
        return f"{rid:<24} {lane:<8} {'dead-letter':<11} {'-':>8}  {error}"
    latency = f"{r['completed_at_ms'] - r['created_at_ms']} ms"
    if r.get("label") is not None:
        shown = f"{r['label']} {r['score']:.3f}" if r.get("score") is not None else r["label"]
    elif r.get("embedding"):
        emb = r["embedding"]
        shown = "[" + ", ".join(f"{v:.4f}" for v in emb[:4]) + (", ...]" if len(emb) > 4 else "]")
        shown += f" ({len(emb)} dims)"
    else:
        shown = "-"
    return f"{rid:<24} {r['priority']:<8} {r['served']:<11} {latency:>8}  {shown}"


def answer_json(settings: Settings, answer: Answer) -> str:
    """One JSON object: ``kind``, ``lane``, ``topic``, ``partition``, ``offset`` and
    the record's fields (bytes as base64)."""
    record: dict[str, Any] = {
        k: base64.b64encode(v).decode("ascii") if isinstance(v, bytes) else v
        for k, v in answer.record.items()
    }
    lane = (
        _lane(settings, record["original_topic"])
        if answer.kind == "dead_letter"
        else record.get("priority")
    )
    head = {
        "kind": answer.kind,
        "lane": lane,
        "topic": answer.topic,
        "partition": answer.partition,
        "offset": answer.offset,
    }
    return json.dumps({**head, **record}, ensure_ascii=False)


def _following(settings: Settings) -> Callable[[], None]:
    def say() -> None:
        click.echo(
            f"following the answers on {settings.topics.results_topic} and "
            f"{settings.topics.dlq_topic}; ^C to stop",
            err=True,
        )

    return say


@click.command("answers")
@bootstrap_option
@click.option(
    "--request-id",
    "request_ids",
    multiple=True,
    help="Only this request's answer (repeatable); exits once each has one.",
)
@click.option(
    "--follow", "-f", is_flag=True, help="Keep printing new answers (like tail -f) until ^C."
)
@click.option(
    "--from-time",
    callback=epoch_ms,
    default=None,
    help="Start at answers written at/after this time (ISO 8601 or epoch ms); default: "
    "the beginning, or the end with --follow and no --request-id.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="table: one aligned line per answer; json: one JSON object per line.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(0),
    default=0.0,
    show_default=True,
    help="With --request-id: give up after this many seconds (0: wait as long as it takes).",
)
@click.pass_obj
def answers_cmd(
    settings: Settings,
    *,
    bootstrap: str | None,
    request_ids: tuple[str, ...],
    follow: bool,
    from_time: int | None,
    fmt: str,
    timeout: float,
) -> None:
    """Print results and dead letters, one line each.

    Without --request-id or --follow it prints what the topics hold and exits.
    With --request-id it prints those answers as they arrive and exits when
    every id has one (status 1 if --timeout passes first). With --follow it
    keeps printing new answers until interrupted.
    """
    from pipeline.kafka.reader import read_answers

    target = with_bootstrap(settings, bootstrap)
    start: Start = from_time if from_time is not None else "beginning"
    if from_time is None and follow and not request_ids:
        start = "end"
    ids = set(request_ids) if request_ids else None
    stream = read_answers(
        target,
        request_ids=ids,
        start=start,
        timeout_s=(timeout or None) if ids else None,
        until_end=not ids and not follow,
        on_start=_following(target) if follow else None,
    )
    answered: set[str] = set()
    header = fmt == "table"
    try:
        for answer in stream:
            if header:
                click.echo(f"{'request_id':<24} {'lane':<8} {'served':<11} {'latency':>8}  answer")
                header = False
            if answer.request_id is not None:
                answered.add(answer.request_id)
            click.echo(
                answer_line(target, answer) if fmt == "table" else answer_json(target, answer)
            )
    except KeyboardInterrupt:
        return
    if ids and ids - answered:
        missing = sorted(ids - answered)
        raise click.ClickException(
            f"no answer within {timeout:g} s for {len(missing)} id(s): {', '.join(missing[:10])}"
        )
