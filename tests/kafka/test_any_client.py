"""Any client can send, a person can read: against a real broker and a real worker.

- the README's Python example gets the answer to its own request, not the
  oldest answer on the topic;
- a JSON request written by ``kcat -P`` (the README's example) is answered
  exactly as its Avro twin; a JSON request that breaks the schema is a dead
  letter naming the field;
- ``pipeline answers`` prints one line per answer, by id, all, or following;
- the worker's dead-letter log line (JSON) carries stage, error class, topic,
  partition, offset and request id as fields.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from harness import Deployment
from support import require

from pipeline.cli import main
from pipeline.kafka.client import RequestProducer, read_answers

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _kcat(dep: Deployment, lane: str, lines: list[str]) -> None:
    """The README's example: one JSON request per line into a lane topic."""
    subprocess.run(
        ["kcat", "-P", "-b", dep.settings.kafka.bootstrap_servers, "-t",
         dep.settings.topics.lane_topic(lane)],
        input="\n".join(lines) + "\n",
        text=True,
        check=True,
        timeout=60,
    )  # fmt: skip


def test_python_json_and_the_answers_command(kafka_bootstrap: str, tmp_path: Path) -> None:
    require(shutil.which("kcat"), "kcat (./run setup installs it: apt-get install kcat)")
    dep = Deployment.create(kafka_bootstrap, tmp_path, partitions=1)
    env = dep.env
    runner = CliRunner()
    with dep.worker(PIPELINE_LOG_FORMAT="json") as worker:
        # Someone else's answers are already on the topics.
        with RequestProducer(dep.settings) as other:
            earlier = [other.send(f"earlier text {i}", request_id=f"old-{i}") for i in range(3)]
        assert {a.request_id for a in other.answers(earlier)} == set(earlier)

        # The README's snippet, as written there.
        settings = dep.settings
        with RequestProducer(settings) as producer:  # connected, idempotent, acks=all
            rid = producer.send("where is my order", lane="realtime")
        answers = list(producer.answers([rid]))  # this request's answer, by its id
        assert [(a.kind, a.request_id) for a in answers] == [("result", rid)]
        # What the old example did: the first answer on the topic, someone else's.
        assert next(iter(read_answers(settings, expect=1))).request_id in earlier

        # JSON from a client that is not this project's Python.
        _kcat(
            dep,
            "standard",
            [
                '{"request_id": "json-1", "text": "where is my order"}',
                '{"request_id": "json-bad", "text": "x", "deadline_ms": "soon"}',
                '{"request_id": 12, "text": "numbered"}',
            ],
        )
        by_id = CliRunner().invoke(
            main,
            ["answers", "--request-id", "json-1", "--request-id", "json-bad", "--timeout", "120",
             "--format", "json"],
            env=env,
        )  # fmt: skip
        assert by_id.exit_code == 0, by_id.output
        got = {r["request_id"]: r for r in map(json.loads, by_id.output.splitlines())}
        assert set(got) == {"json-1", "json-bad"}
        avro = answers[0].record
        json_result = got["json-1"]
        assert json_result["kind"] == "result" and json_result["lane"] == "standard"
        assert json_result["embedding"] == avro["embedding"]
        assert json_result["model_name"] == avro["model_name"]
        bad = got["json-bad"]
        assert bad["kind"] == "dead_letter" and bad["stage"] == "validate"
        assert bad["error_message"] == "field 'deadline_ms': expected null or long, got a string"

        # The worker's dead-letter log line carries its facts as fields.
        logged = [json.loads(ln) for ln in worker.log().splitlines() if ln.startswith("{")]
        [letter] = [r for r in logged if r.get("request_id") == "json-bad"]
        assert letter["stage"] == "validate" and letter["error_class"] == "ValidationError"
        assert letter["topic"] == dep.settings.topics.lane_topic("standard")
        assert (letter["partition"], letter["offset"]) == (
            bad["original_partition"],
            bad["original_offset"],
        )

        # Everything so far, as a table, and it exits at the end of the topics.
        table = runner.invoke(main, ["answers"], env=env)
        assert table.exit_code == 0, table.output
        lines = table.output.splitlines()
        assert lines[0].split() == ["request_id", "lane", "served", "latency", "answer"]
        assert len(lines) == 1 + 3 + 1 + 3  # header, earlier, README's, the three JSON lines
        [numbered] = [ln for ln in lines if "dead-letter" in ln and "request_id" in ln]
        assert "validate: ValidationError: field 'request_id': expected a string" in numbered
        assert any(ln.startswith(f"{rid} ") and " realtime " in ln for ln in lines)

        _follow_prints_what_comes_next(dep)


def _follow_prints_what_comes_next(dep: Deployment) -> None:
    """``pipeline answers --follow`` prints what comes next, and only that."""
    settings, env = dep.settings, dep.env
    follow = subprocess.Popen(
        [sys.executable, "-c", "from pipeline.cli import main; main()", "answers",
         "--follow", "--format", "json"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert follow.stderr is not None
        assert follow.stderr.readline().startswith("following the answers")
        with RequestProducer(settings) as late:
            late_id = late.send("a later question", lane="bulk")
        assert follow.stdout is not None
        first = json.loads(follow.stdout.readline())
        assert first["request_id"] == late_id
    finally:
        follow.terminate()
        follow.communicate(timeout=30)  # and closes its pipes
