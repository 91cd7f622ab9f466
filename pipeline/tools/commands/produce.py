"""``pipeline produce``: lines of text or JSON in, one request per line out.

Every line is checked before anything about it is sent: a line that is not
UTF-8, not a JSON object of the right types, or holds a text the worker would
refuse (empty, over the caps) is reported in one line naming the line number,
and the lines after it are still sent; the exit status is then 1.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, BinaryIO

import click

from pipeline.errors import ConfigurationError, PipelineError
from pipeline.settings import LANES, Settings
from pipeline.tools.commands.options import bootstrap_option, connect_timeout_option, with_bootstrap

__all__ = ["parse_line", "produce"]

_JSON_KEYS = {"text", "priority", "lane", "request_id", "deadline_ms", "timeout_ms"}


def _integer(obj: dict[str, Any], key: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f'"{key}" must be an integer, got {json.dumps(value)[:40]}')
    return value


def parse_line(line: str, default_lane: str) -> dict[str, Any]:
    """One input line as ``{"text", "lane", "request_id", "deadline_ms"}``.

    Raises ValueError saying what is wrong with a JSON line; plain lines are
    taken as they are (checked later, when sent).
    """
    stripped = line.strip()
    if not stripped.startswith("{"):
        return {
            "text": line.rstrip("\r\n"),
            "lane": default_lane,
            "request_id": None,
            "deadline_ms": None,
        }
    try:
        obj = json.loads(stripped)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError("a JSON line must be an object")
    unknown = sorted(set(obj) - _JSON_KEYS)
    if unknown:
        raise ValueError(f'unknown key "{unknown[0]}"; keys are {", ".join(sorted(_JSON_KEYS))}')
    if not isinstance(obj.get("text"), str):
        raise ValueError('a JSON line needs a "text" string')
    rid = obj.get("request_id")
    if rid is not None and not isinstance(rid, str):
        raise ValueError(f'"request_id" must be a string, got {json.dumps(rid)[:40]}')
    lane = obj.get("priority") or obj.get("lane") or default_lane
    if lane not in LANES:
        raise ValueError(f'"priority" must be one of {", ".join(LANES)}, got {lane!r:.40}')
    deadline = _integer(obj, "deadline_ms")
    timeout = _integer(obj, "timeout_ms")
    if deadline is None and timeout is not None:
        deadline = int(time.time() * 1000) + timeout
    return {"text": obj["text"], "lane": lane, "request_id": rid, "deadline_ms": deadline}


def _lines(source: BinaryIO) -> Any:
    """``(number, text or None, error)`` per line; non-UTF-8 lines carry the error."""
    for number, raw in enumerate(source, 1):
        try:
            yield number, raw.decode("utf-8"), ""
        except UnicodeDecodeError as exc:
            yield number, None, f"not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})"


@click.command("produce")
@bootstrap_option
@click.option(
    "--lane",
    "-l",
    type=click.Choice(LANES),
    default="standard",
    show_default=True,
    help="Lane for lines that do not name one.",
)
@click.option(
    "--format",
    "framing",
    type=click.Choice(["single-object", "registry"]),
    default="single-object",
    show_default=True,
    help="Avro single-object encoding, or the Confluent Schema Registry's framing (the "
    "schema registered under each lane topic's <topic>-value at PIPELINE_REGISTRY_URL).",
)
@connect_timeout_option
@click.argument("source", type=click.File("rb"), default="-")
@click.pass_obj
def produce(  # noqa: PLR0917  (one parameter per flag, as click passes them)
    settings: Settings,
    bootstrap: str | None,
    lane: str,
    framing: str,
    connect_timeout: float,
    source: BinaryIO,
) -> None:
    """Send texts from SOURCE (a file, or - for stdin) as inference requests.

    Each line is either plain text, or a JSON object with "text" and optional
    "priority" (realtime|standard|bulk), "request_id" (a string), "deadline_ms"
    (absolute epoch ms) or "timeout_ms" (relative). Blank lines are skipped.
    Connects first: a wrong address or missing lane topics stop it before
    anything is sent. Prints one request_id per line sent; lines that cannot be
    sent (not UTF-8, bad JSON, empty or over-size text) are reported one line
    each and make the exit status 1, after the others were sent.
    """
    from tqdm import tqdm

    from pipeline.kafka.client import RequestProducer

    bad: list[str] = []
    sent = 0
    target = with_bootstrap(settings, bootstrap)
    with RequestProducer(
        target, source="pipeline produce", connect_timeout_s=connect_timeout, framing=framing
    ) as producer:
        lines = tqdm(_lines(source), unit=" req", disable=None, file=sys.stderr, desc="producing")
        for number, line, error in lines:
            if line is None:
                bad.append(f"line {number}: {error}")
                continue
            if not line.strip():
                continue
            try:
                item = parse_line(line, lane)
                rid = producer.send(
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
        if len(bad) > 10:
            click.echo(f"... and {len(bad) - 10} more", err=True)
        raise click.ClickException(f"{len(bad)} line(s) could not be sent")
