"""The README's main command: the whole pipeline on the local broker with sample traffic.

``./run demo`` (or ``python -m pipeline.tools.demo``) starts the local broker if it
is not running, creates the topics, starts one worker process, sends sample
texts at mixed priorities (with duplicates and one invalid request), prints
every answer and the dead letter, then stops what it started.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import uuid
from pathlib import Path

import click

from pipeline.kafka.client import Answer, RequestProducer, read_answers, request_bytes
from pipeline.kafka.topics import create_topics
from pipeline.settings import Settings, WorkerSettings
from pipeline.tools.commands.options import keep_broker_option
from pipeline.tools.kafka_local import LocalKafka
from pipeline.tools.supervise import WorkerProcess

__all__ = ["main", "run_demo"]

SAMPLES: list[tuple[str, str]] = [
    ("realtime", "is this card transaction fraudulent?"),
    ("realtime", "where is my order right now"),
    ("standard", "how do I reset my password"),
    ("standard", "the battery drains overnight even when the phone is idle"),
    ("standard", "how do I reset my password"),  # duplicate of a standard request
    ("standard", "compare the premium and basic plans"),
    ("bulk", "quarterly report: revenue grew in every region except the north-west"),
    ("bulk", "customer review: great fit, fast delivery, would buy again"),
    ("bulk", "customer review: great   fit, fast delivery, would buy again "),  # same text
    ("bulk", "how do I reset my password"),  # the same text on another lane
    ("bulk", "archive note: contract renewed for two more years"),
]


def _step(message: str) -> None:
    click.secho(f"==> {message}", fg="cyan", err=True)


def _print_answers(answers: list[Answer], lanes: dict[str, str]) -> None:
    click.echo(f"\n{'request':10} {'lane':9} {'served':9} {'batch':>5} {'latency':>9}  embedding")
    for a in sorted(answers, key=lambda a: list(lanes).index(a.record["request_id"])):
        r = a.record
        if a.kind != "result":
            continue
        latency = r["completed_at_ms"] - r["created_at_ms"]
        head = ", ".join(f"{x:+.3f}" for x in (r["embedding"] or [])[:3])
        click.echo(
            f"{r['request_id'][:10]:10} {r['priority']:9} {r['served']:9} {r['batch_size']:>5} "
            f"{latency:>7} ms  [{head}, ...] ({len(r['embedding'] or [])} dims)"
        )
    for a in answers:
        if a.kind == "dead_letter":
            r = a.record
            click.echo(
                f"\ndead letter: request {r['request_id']} from {r['original_topic']}"
                f"[{r['original_partition']}]@{r['original_offset']}: stage={r['stage']} "
                f"{r['error_class']}: {r['error_message']}"
            )


def _traffic(
    settings: Settings, worker: WorkerProcess, log: Path
) -> tuple[list[Answer], dict[str, str]]:
    """Send the samples once the worker is ready; collect this run's answers."""
    # Made before the worker is ready so its idempotent-producer id is settled by then.
    producer = RequestProducer(settings, source="pipeline demo")
    click.echo(f"    ready in {worker.wait_ready():.1f}s (log: {log})", err=True)
    _step(f"sending {len(SAMPLES) + 1} requests at mixed priorities")
    run = uuid.uuid4().hex[:6]
    lanes: dict[str, str] = {}
    for i, (lane, text) in enumerate(SAMPLES):
        lanes[producer.send(text, lane=lane, request_id=f"{run}-{i:02d}")] = lane
    # A blank text, sent as raw bytes (the client refuses it): the worker dead-letters it.
    bad, value = request_bytes("   ", request_id=f"{run}-bad")
    producer.send_raw("standard", None, value)
    lanes[bad] = "standard"
    producer.flush()
    del producer  # closes its connections before the broker may go away
    _step("waiting for results and dead letters")
    answers: list[Answer] = []
    # read_answers reads from the start of both topics: keep this run's answers only
    for answer in read_answers(settings, timeout_s=90):
        if answer.record.get("request_id") in lanes:
            answers.append(answer)
        if len({a.record["request_id"] for a in answers}) == len(lanes):
            break
    return answers, lanes


def _worker_data_dir(settings: Settings) -> str:
    """The demo worker's RocksDB folder. By default it sits beside the local broker's
    data, so the two stay a pair: a worker's tables must never be ahead of the broker's
    changelog (Faust stops with a ConsistencyError when they are), which a shared
    default folder would be after the broker's folder changed or was wiped."""
    if settings.worker.data_dir != WorkerSettings().data_dir:
        return settings.worker.data_dir
    broker = Path(settings.local_kafka.data_dir).expanduser()
    return str(broker.with_name(broker.name + "-worker"))


def run_demo(settings: Settings, *, keep_broker: bool = False) -> int:
    """Run the demo; return the process exit status (0 when every request was answered)."""
    broker = LocalKafka(settings.local_kafka)
    was_running = broker.status()["running"]
    _step("starting the local Kafka broker" if not was_running else "local broker already up")
    t0 = time.monotonic()
    bootstrap = broker.up()
    click.echo(f"    broker at {bootstrap} ({time.monotonic() - t0:.1f}s)", err=True)
    kafka = dataclasses.replace(settings.kafka, bootstrap_servers=bootstrap)
    settings = settings.replace(kafka=kafka)
    worker: WorkerProcess | None = None
    try:
        _step("creating topics")
        for name, state in create_topics(settings).items():
            click.echo(f"    {state:8} {name}", err=True)
        _step("starting a worker: faust -A pipeline.app worker -l info")
        data_dir = _worker_data_dir(settings)
        log = Path(data_dir).with_suffix(".demo.log")
        worker = WorkerProcess.start(
            {
                "PIPELINE_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
                "PIPELINE_TOPICS_PREFIX": settings.topics.prefix,
                "PIPELINE_WORKER_DATA_DIR": data_dir,
                "PIPELINE_WORKER_WEB_PORT": str(settings.worker.web_port),
                "PIPELINE_METRICS_PORT": str(settings.metrics.port),
            },
            log,
        )
        answers, lanes = _traffic(settings, worker, log)
        _print_answers(answers, lanes)
        missing = set(lanes) - {a.record["request_id"] for a in answers}
        if missing:
            click.secho(f"\n{len(missing)} requests unanswered: {sorted(missing)}", fg="red")
            return 1
        click.secho(f"\nall {len(lanes)} requests answered", fg="green")
        return 0
    finally:
        if worker is not None:
            _step("stopping the worker")
            worker.stop()
        if not was_running and not keep_broker:
            _step("stopping the local broker")
            broker.down()


@click.command()
@keep_broker_option
def main(keep_broker: bool) -> None:
    """Run the pipeline on the local broker with sample traffic, then clean up."""
    sys.exit(run_demo(Settings.from_env(), keep_broker=keep_broker))


if __name__ == "__main__":
    main()
