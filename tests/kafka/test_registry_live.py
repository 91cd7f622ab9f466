"""Schema Registry users, against the real broker, a real worker and a real registry
server (franz-go's srfake, built from ops/schema-registry; the ``schema_registry``
fixture):

- producers written as a registry user writes them (confluent-kafka's
  ``AvroSerializer``, nothing of this project) on the current request schema,
  an older one and a newer one are answered; ``pipeline.kafka.client`` and ``pipeline
  produce --format registry`` send the same framing;
- with ``PIPELINE_REGISTRY_ANSWER_FRAMING=registry`` results and dead letters
  come back in the registry's framing, their schemas under ``<topic>-value``,
  and confluent-kafka's ``AvroDeserializer`` reads them; so does ``pipeline answers``;
- an unknown schema id, an incompatible writer schema and a corrupt body are
  dead letters naming the cause;
- the registry stopped mid-run: nothing is dead-lettered, records of a schema
  already known go on, the held ones are all answered once it is back;
- a worker that cannot register its answer schemas stops with one line.

The worker runs the no-op model: what is under test is the framing, not the model.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from harness import Deployment

from pipeline.cli import main
from pipeline.codecs.avro import SCHEMA_DIR
from pipeline.codecs.registry import frame_header
from pipeline.kafka.client import RequestProducer
from pipeline.tools.registry_local import LocalRegistry, RunningRegistry
from pipeline.tools.supervise import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

CURRENT = (SCHEMA_DIR / "InferenceRequest.avsc").read_text()
V1 = (SCHEMA_DIR / "history" / "InferenceRequest.v1.avsc").read_text()
_current = json.loads(CURRENT)
#: A producer a version ahead of this worker: one more field, with a default.
NEWER = json.dumps(
    {
        **_current,
        "fields": [*_current["fields"], {"name": "tenant", "type": "string", "default": ""}],
    }
)
#: The README's producer: a schema written from the field list, two fields.
README_SCHEMA = """{"type": "record", "name": "InferenceRequest", "namespace": "pipeline",
  "fields": [{"name": "request_id", "type": "string"}, {"name": "text", "type": "string"}]}"""
#: Not compatible with the worker's: text is a number.
WRONG = json.dumps(
    {
        **_current,
        "fields": [{"name": "request_id", "type": "string"}, {"name": "text", "type": "long"}],
    }
)


def _request(rid: str, text: str, **fields: Any) -> dict[str, Any]:
    return {
        "request_id": rid,
        "text": text,
        "created_at_ms": int(time.time() * 1000),
        "deadline_ms": None,
        "source": "avro-serializer",
        "metadata": {},
    } | fields


def _serialize(
    client: SchemaRegistryClient, schema: str, topic: str, record: dict[str, Any]
) -> bytes:
    """What a registry user's producer writes: AvroSerializer, topic-name subjects."""
    value = AvroSerializer(client, schema)(record, SerializationContext(topic, MessageField.VALUE))
    assert isinstance(value, bytes)
    return value


def _produce(dep: Deployment, topic: str, values: list[bytes]) -> None:
    producer = Producer(
        {"bootstrap.servers": dep.settings.kafka.bootstrap_servers, "enable.idempotence": True}
    )
    for value in values:
        producer.produce(topic, value=value)
    assert producer.flush(30) == 0


def _read_with_deserializer(
    dep: Deployment, client: SchemaRegistryClient, expect: int, timeout_s: float = 120.0
) -> Iterator[tuple[str, dict[str, Any], bytes]]:
    """(topic, record, raw value) for each answer, decoded by AvroDeserializer alone."""
    topics = (dep.settings.topics.results_topic, dep.settings.topics.dlq_topic)
    consumer = Consumer(
        {
            "bootstrap.servers": dep.settings.kafka.bootstrap_servers,
            "group.id": "registry-reader",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(t, 0, OFFSET_BEGINNING) for t in topics])
    deserialize = AvroDeserializer(client)
    deadline = time.monotonic() + timeout_s
    seen = 0
    try:
        while seen < expect:
            assert time.monotonic() < deadline, f"{seen} of {expect} answers read"
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            topic, value = msg.topic(), msg.value()
            assert topic is not None and value is not None
            record = deserialize(value, SerializationContext(topic, MessageField.VALUE))
            seen += 1
            yield topic, record, value
    finally:
        consumer.close()


def test_registry_users_send_and_read_through_the_worker(
    kafka_bootstrap: str, schema_registry: RunningRegistry, tmp_path: Path
) -> None:
    dep = Deployment.create(
        kafka_bootstrap,
        tmp_path,
        partitions=1,
        PIPELINE_MODEL_TASK="noop",
        PIPELINE_REGISTRY_URL=schema_registry.url,
        PIPELINE_REGISTRY_ANSWER_FRAMING="registry",
    )
    topics = dep.settings.topics
    lane = topics.lane_topic("standard")
    client = SchemaRegistryClient({"url": schema_registry.url})
    with client, dep.worker():
        # Registered at start-up, under the topic-name strategy's subjects.
        subjects = set(client.get_subjects())
        assert {f"{topics.results_topic}-value", f"{topics.dlq_topic}-value"} <= subjects

        current_id = client.register_schema(f"{lane}-value", Schema(CURRENT, "AVRO"))
        good = [
            _serialize(
                client, CURRENT, lane, _request("cur", "where is my order", metadata={"k": "v"})
            ),
            _serialize(
                client,
                V1,
                lane,
                {
                    "request_id": "old",
                    "text": "an older producer",
                    "created_at_ms": 0,
                    "deadline_ms": None,
                },
            ),
            _serialize(client, NEWER, lane, _request("new", "a newer producer", tenant="acme")),
            _serialize(client, README_SCHEMA, lane, {"request_id": "readme", "text": "hi"}),
        ]
        unknown = frame_header(424242) + good[0][5:]
        wrong = _serialize(client, WRONG, lane, {"request_id": "bad-type", "text": 5})
        corrupt = frame_header(current_id) + b"\x02r\xff\xff\xff"
        _produce(dep, lane, [*good, unknown, wrong, corrupt])

        # This project's own client and CLI, in the same framing.
        with RequestProducer(dep.settings, framing="registry") as producer:
            rid = producer.send(
                "sent by pipeline.kafka.client", lane="realtime", request_id="client"
            )
        source = tmp_path / "lines.txt"
        source.write_text('{"text": "sent by pipeline produce", "request_id": "cli"}\n')
        sent = CliRunner().invoke(
            main, ["produce", "--format", "registry", "--lane", "bulk", str(source)], env=dep.env
        )
        assert sent.exit_code == 0, sent.output
        assert sent.stdout.split() == ["cli"]
        for lane_name in ("realtime", "standard", "bulk"):
            assert f"{topics.lane_topic(lane_name)}-value" in set(client.get_subjects())

        got = list(_read_with_deserializer(dep, client, expect=9))
        results = {r["request_id"]: r for t, r, _ in got if t == topics.results_topic}
        letters = [(r, v) for t, r, v in got if t == topics.dlq_topic]
        assert set(results) == {"cur", "old", "new", "readme", rid, "cli"}
        assert results["cur"]["metadata"] == {"k": "v"}
        assert (
            results["cur"]["served"] == "computed" and results["client"]["priority"] == "realtime"
        )
        assert all(v[:1] == b"\x00" for _t, _r, v in got)  # every answer in the registry's framing
        causes = {
            bytes(r["value"]): (r["stage"], r["error_class"], r["error_message"])
            for r, _v in letters
        }
        assert causes[unknown][:2] == ("decode", "UnknownSchemaId")
        assert "424242" in causes[unknown][2]
        assert causes[wrong][:2] == ("decode", "SchemaMismatch")
        assert causes[corrupt][:2] == ("decode", "DecodeError")
        assert "corrupt InferenceRequest body" in causes[corrupt][2]

        # `pipeline answers` reads the registry's framing too.
        shown = CliRunner().invoke(
            main,
            [
                "answers",
                "--request-id",
                "cli",
                "--request-id",
                "old",
                "--timeout",
                "60",
                "--format",
                "json",
            ],
            env=dep.env,
        )
        assert shown.exit_code == 0, shown.output
        lines = [json.loads(line) for line in shown.stdout.splitlines()]
        assert {(a["request_id"], a["kind"]) for a in lines} == {
            ("cli", "result"),
            ("old", "result"),
        }


def _metric(port: int, name: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def test_a_registry_down_mid_run_holds_its_records_and_dead_letters_none(
    kafka_bootstrap: str, local_registry: LocalRegistry, tmp_path: Path
) -> None:
    registry = local_registry.start()
    port = registry.port
    dep = Deployment.create(
        kafka_bootstrap,
        tmp_path,
        partitions=1,
        PIPELINE_MODEL_TASK="noop",
        PIPELINE_REGISTRY_URL=registry.url,
        PIPELINE_REGISTRY_TIMEOUT_S="1",
        PIPELINE_REGISTRY_RETRY_BACKOFF_MS="100",
        PIPELINE_REGISTRY_RETRY_BACKOFF_MAX_MS="500",
    )
    std, bulk = dep.settings.topics.lane_topic("standard"), dep.settings.topics.lane_topic("bulk")
    client = SchemaRegistryClient({"url": registry.url})
    metrics_port = free_port()
    try:
        with dep.worker(PIPELINE_METRICS_PORT=str(metrics_port)) as worker:
            _produce(dep, std, [_serialize(client, CURRENT, std, _request("first", "hello"))])
            assert [a.request_id for a in dep.answers(expect=1)] == ["first"]  # id 1 now known

            # Written while the registry is up (the producer registers V1: id 2), sent
            # after it went down: the worker has never seen id 2.
            held = [
                _serialize(
                    client,
                    V1,
                    std,
                    {
                        "request_id": f"held-{i}",
                        "text": f"text {i}",
                        "created_at_ms": 0,
                        "deadline_ms": None,
                    },
                )
                for i in range(20)
            ]
            known = _serialize(client, CURRENT, bulk, _request("known", "a known schema"))
            client.close()
            registry.stop()
            _produce(dep, std, held)
            _produce(dep, bulk, [known])
            # Another partition, an id already known: answered while the registry is down.
            answered = {a.request_id: a.kind for a in dep.answers(expect=2, timeout_s=60)}
            assert answered == {"first": "result", "known": "result"}
            deadline = time.monotonic() + 30
            while _metric(metrics_port, "pipeline_registry_waiting_schemas") != 1:
                assert time.monotonic() < deadline, "the worker never said it waits"
                time.sleep(0.2)
            time.sleep(2)  # lookups fail again and again meanwhile
            assert "schema registry unavailable looking up schema 2" in worker.log()
            assert {a.request_id for a in dep.answers(expect=3, timeout_s=3)} == {"first", "known"}

            # Back on the same address, holding what it held: srfake keeps nothing
            # in memory across a restart, so it is seeded with the same schemas in the
            # same order (a real registry keeps them in Kafka). It registers them before
            # it listens: the worker never sees it empty.
            registry = local_registry.start(
                port=port, seed=[(f"{std}-value", CURRENT), (f"{std}-value", V1)]
            )
            with SchemaRegistryClient({"url": registry.url}) as again:
                assert again.get_schema(2).schema_str == V1
            answers = dep.answers(expect=22, timeout_s=120)
            assert len(answers) == 22
            assert {a.kind for a in answers} == {"result"}  # nothing dead-lettered
            assert {a.request_id for a in answers} >= {f"held-{i}" for i in range(20)}
            assert _metric(metrics_port, "pipeline_registry_waiting_schemas") == 0
    finally:
        registry.stop()


def test_a_worker_that_cannot_register_its_answer_schemas_stops_in_one_line(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    dep = Deployment.create(kafka_bootstrap, tmp_path, partitions=1, PIPELINE_MODEL_TASK="noop")
    worker = dep.spawn(PIPELINE_REGISTRY_URL=nobody, PIPELINE_REGISTRY_ANSWER_FRAMING="registry")
    code = worker.proc.wait(timeout=120)
    last = worker.log().strip().splitlines()[-1]
    assert code != 0
    assert last.startswith(
        "pipeline: PIPELINE_REGISTRY_ANSWER_FRAMING=registry: cannot register "
        f"InferenceResult under {dep.settings.topics.results_topic}-value "
        f"at {nobody}: "
    ), last
