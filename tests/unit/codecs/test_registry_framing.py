"""The Confluent Schema Registry's framing, without a registry: the pure parts.

- the 5-byte frame (magic 00, big-endian schema id) and its refusals;
- decoding with a writer schema resolved to the reader's: an older and a newer
  compatible writer read, an incompatible one (SchemaMismatch), a body that
  does not decode, bytes left over, an unknown id (the lookup's own error);
- intake over registry-framed bytes, and without a registry configured;
- answers encoded with the registry's header carry the single-object body;
- settings that cannot work are named;
- the lane reader holds a partition's registry-framed records while their
  schema is looked up, and while the registry does not answer (retried, never
  dead-lettered), takes the other partitions meanwhile, and dead-letters an
  id the registry does not know. The registry there is a function standing in
  for :class:`pipeline.codecs.registry.RegistryClient` (tests/kafka/test_registry_live.py
  runs the real server); what is under test is the reader's waiting.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
from typing import Any

import fastavro
import pytest
from support.runtime import InstantBroker, LengthEngine

from pipeline.codecs.avro import HEADER_LEN, SCHEMA_DIR, request_codec, result_codec
from pipeline.codecs.registry import FRAME_LEN, WriterSchema, frame_header, split_frame, subject_of
from pipeline.errors import (
    DecodeError,
    RegistryUnavailable,
    SchemaMismatch,
    UnknownSchemaId,
)
from pipeline.observability.metrics import PipelineMetrics
from pipeline.settings import RegistrySettings, Settings, ValidationSettings
from pipeline.worker.intake import parse
from pipeline.worker.lane_reader import Consumer, LaneReader
from pipeline.worker.ledger import Ledger
from pipeline.worker.runtime import Runtime
from pipeline.worker.writer_schemas import WriterSchemas

CURRENT = json.loads((SCHEMA_DIR / "InferenceRequest.avsc").read_text())
V1 = json.loads((SCHEMA_DIR / "history" / "InferenceRequest.v1.avsc").read_text())
#: A newer version a producer might be on: one more field, with a default.
NEWER = {
    **CURRENT,
    "fields": [*CURRENT["fields"], {"name": "tenant", "type": "string", "default": ""}],
}
#: Not compatible: text is a number.
WRONG = {
    **CURRENT,
    "fields": [{"name": "request_id", "type": "string"}, {"name": "text", "type": "long"}],
}


def framed(schema: dict[str, Any], record: dict[str, Any], schema_id: int) -> bytes:
    buf = io.BytesIO()
    buf.write(frame_header(schema_id))
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return buf.getvalue()


def _req(rid: str, text: str, **fields: Any) -> dict[str, Any]:
    """An InferenceRequest record with the current schema's defaults."""
    record = {"request_id": rid, "text": text, "created_at_ms": 0, "deadline_ms": None}
    return record | {"source": "", "metadata": {}} | fields


def writers(**by_id: dict[str, Any]) -> Any:
    parsed = {int(k[1:]): fastavro.parse_schema(v) for k, v in by_id.items()}

    def writer_of(schema_id: int) -> Any:
        if schema_id not in parsed:
            raise UnknownSchemaId(f"the Schema Registry has no schema {schema_id}")
        return parsed[schema_id]

    return writer_of


def test_the_frame_is_magic_zero_and_a_big_endian_id() -> None:
    assert frame_header(1) == b"\x00\x00\x00\x00\x01"
    assert frame_header(0x01020304) == b"\x00\x01\x02\x03\x04"
    assert split_frame(frame_header(70_000) + b"body") == 70_000
    assert FRAME_LEN == 5
    for bad in (b"", b"\x00\x00\x00\x01", b"\x01\x00\x00\x00\x01body"):
        with pytest.raises(DecodeError, match="not Confluent Schema Registry framing"):
            split_frame(bad)
    assert subject_of("inference.results") == "inference.results-value"


def test_older_and_newer_compatible_writers_are_read_as_the_current_schema() -> None:
    codec = request_codec()
    writer_of = writers(i1=V1, i2=NEWER, i3=CURRENT)
    old = codec.decode_registry(
        framed(V1, {"request_id": "r", "text": "t"} | _v1_rest(), 1), writer_of
    )
    assert old == {
        "request_id": "r",
        "text": "t",
        "created_at_ms": 0,
        "deadline_ms": None,
        "source": "",
        "metadata": {},
    }
    newer = {
        "request_id": "n",
        "text": "t",
        "created_at_ms": 5,
        "deadline_ms": 9,
        "source": "s",
        "metadata": {"k": "v"},
        "tenant": "acme",
    }
    got = codec.decode_any(framed(NEWER, newer, 2), writer_of)
    assert got == {k: v for k, v in newer.items() if k != "tenant"}
    same = codec.decode_any(framed(CURRENT, got, 3), writer_of)
    assert same == got


def _v1_rest() -> dict[str, Any]:
    """V1's fields beyond request_id and text, at their defaults (whatever they are)."""
    return {
        f["name"]: f.get("default") for f in V1["fields"] if f["name"] not in ("request_id", "text")
    }


def test_what_cannot_be_read_is_a_decode_error_naming_its_cause() -> None:
    codec = request_codec()
    writer_of = writers(i3=CURRENT, i4=WRONG)
    with pytest.raises(UnknownSchemaId, match="no schema 99"):
        codec.decode_any(frame_header(99) + b"\x02r\x02t", writer_of)
    with pytest.raises(SchemaMismatch, match="writer schema 4 cannot be read"):
        codec.decode_any(framed(WRONG, {"request_id": "r", "text": 7}, 4), writer_of)
    good = framed(CURRENT, _req("r", "t"), 3)
    with pytest.raises(DecodeError, match="corrupt InferenceRequest body"):
        codec.decode_any(good[:-3], writer_of)
    with pytest.raises(DecodeError, match="2 trailing bytes"):
        codec.decode_any(good + b"\x00\x00", writer_of)
    with pytest.raises(DecodeError, match="no registry is configured"):
        codec.decode_any(good)  # no writer_of: a worker without PIPELINE_REGISTRY_URL


def test_intake_parses_registry_framed_requests() -> None:
    value = framed(CURRENT, _req("r-1", "hello", created_at_ms=10, metadata={"a": "b"}), 3)
    req = parse(
        value,
        lane="bulk",
        lane_deadline_ms=100,
        model_id="m",
        limits=ValidationSettings(),
        received_at_ms=50,
        writer_of=writers(i3=CURRENT),
    )
    assert (req.request_id, req.text, req.deadline_ms, req.metadata) == (
        "r-1",
        "hello",
        110,
        {"a": "b"},
    )
    with pytest.raises(UnknownSchemaId):
        parse(
            value,
            lane="bulk",
            lane_deadline_ms=100,
            model_id="m",
            limits=ValidationSettings(),
            received_at_ms=50,
            writer_of=writers(),
        )


def test_an_answer_with_the_registry_header_carries_the_single_object_body() -> None:
    codec = result_codec()
    record: dict[str, Any] = {
        "request_id": "r",
        "content_hash": "h",
        "model_name": "m",
        "model_version": "1",
        "task": "embed",
        "priority": "bulk",
        "embedding": [0.5, 1.5],
        "label": None,
        "score": None,
        "served": "computed",
        "created_at_ms": 1,
        "completed_at_ms": 2,
        "queue_ms": 0.0,
        "inference_ms": 0.0,
        "batch_size": 1,
        "metadata": {},
    }
    single = codec.encode(record)
    registry = codec.encode(record, header=frame_header(7))
    assert registry == frame_header(7) + single[HEADER_LEN:]
    decoded = codec.decode_any(registry, lambda _id: codec.current.parsed)
    assert decoded["request_id"] == "r" and decoded["embedding"] == [0.5, 1.5]


# -- the lane reader waits for a schema ---------------------------------------------


class _Registry:
    """Stands in for RegistryClient.schema (called on the lookup thread): answers from
    ``schemas``, or raises RegistryUnavailable while ``down`` is set."""

    def __init__(self, **by_id: dict[str, Any]) -> None:
        self.schemas = {int(k[1:]): v for k, v in by_id.items()}
        self.down = threading.Event()
        self.calls: list[int] = []

    def __call__(self, schema_id: int) -> WriterSchema:
        self.calls.append(schema_id)
        if self.down.is_set():
            raise RegistryUnavailable("connection refused")
        if schema_id not in self.schemas:
            raise UnknownSchemaId(f"the Schema Registry has no schema {schema_id}")
        text = json.dumps(self.schemas[schema_id])
        return WriterSchema(schema_id, text, fastavro.parse_schema(self.schemas[schema_id]))


LANE_OF = {"lane.realtime": "realtime", "lane.standard": "standard", "lane.bulk": "bulk"}


class _Record:
    def __init__(self, topic: str, partition: int, offset: int, value: bytes) -> None:
        self.topic, self.partition, self.offset, self.value = topic, partition, offset, value
        self.key = None
        self.tp = (topic, partition)
        self.timestamp = 1.0


def _request(schema: dict[str, Any], schema_id: int, rid: str) -> bytes:
    return framed(schema, _req(rid, f"text {rid}"), schema_id)


def test_the_reader_holds_a_partition_until_the_registry_answers() -> None:
    topic = "lane.standard"
    registry = _Registry(i1=CURRENT)
    registry.down.set()
    settings = Settings.from_env(
        {"PIPELINE_SCHEDULER_WINDOW_MS": "0", "PIPELINE_WORKER_EXPIRE_LANES": ""}
    )
    settings = settings.replace(
        registry=RegistrySettings(
            url="http://registry.invalid", retry_backoff_ms=10, retry_backoff_max_ms=40
        )
    )

    async def main() -> None:
        broker = InstantBroker()
        metrics = PipelineMetrics(process_collectors=False)
        schemas = WriterSchemas(settings.registry, metrics, fetch=registry)
        ledger = Ledger(settings, LANE_OF, clock_ms=lambda: 0)
        buffer = ledger.buffer

        async def start(tp: Any) -> int:
            return 0

        async def nothing(*args: Any) -> None:
            return None

        reader = LaneReader(
            ledger,
            Consumer(
                seek=nothing,
                add_gap=nothing,
                start_offset=start,
                position=nothing,
                pass_end=lambda tp, low, high: None,
            ),
        )
        runtime = Runtime(
            settings,
            engine=LengthEngine(),  # type: ignore[arg-type]
            publisher=broker.publisher(),
            ack=nothing,
            ledger=ledger,
            metrics=metrics,
            on_room=reader.wake,
            schemas=schemas,
        )
        tasks = [asyncio.ensure_future(reader.run(runtime)), asyncio.ensure_future(runtime.run())]
        try:
            buffer.put(
                [
                    _Record(topic, 0, 0, _request(CURRENT, 1, "a0")),
                    _Record(topic, 0, 1, request_codec().encode(_req("a1", "single"))),
                    _Record(topic, 1, 0, request_codec().encode(_req("b0", "other partition"))),
                    _Record(topic, 1, 1, _request(CURRENT, 2, "b1")),
                ]
            )
            await _until(lambda: [r["request_id"] for r in broker.results] == ["b0"])
            await _until(lambda: len(registry.calls) >= 3)  # asked again and again
            assert broker.letters == []  # the registry being down is not the input's fault
            assert metrics.value("pipeline_registry_waiting_schemas") == 2
            assert buffer.pending("standard") == 3  # a0 and a1 wait behind id 1; b1 too
            registry.down.clear()
            await _until(lambda: len(broker.results) == 3 and len(broker.letters) == 1)
            assert sorted(r["request_id"] for r in broker.results) == ["a0", "a1", "b0"]
            letter = _letter(broker.letters[0])
            assert letter["error_class"] == "UnknownSchemaId" and letter["stage"] == "decode"
            assert "no schema 2" in letter["error_message"]
            assert metrics.value("pipeline_registry_waiting_schemas") == 0
            calls = len(registry.calls)
            buffer.put(
                [
                    _Record(topic, 0, 2, _request(CURRENT, 1, "a2")),
                    _Record(topic, 1, 2, _request(CURRENT, 2, "b2")),
                ]
            )
            await _until(lambda: len(broker.results) == 4 and len(broker.letters) == 2)
            assert len(registry.calls) == calls  # both ids answered from the cache
            found = metrics.value("pipeline_registry_lookups_total", {"outcome": "found"})
            assert found == 1
            # The registry's copy of the current schema is read as the codec's own: no
            # resolution per record.
            assert schemas.writer(1) is request_codec().current.parsed
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await runtime.close(5.0)

    asyncio.run(main())


def _letter(value: bytes) -> dict[str, Any]:
    from pipeline.codecs.avro import dead_letter_codec

    return dead_letter_codec().decode(value)


async def _until(done: Any, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not done():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.005)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"PIPELINE_REGISTRY_URL": "ftp://registry:8081"}, "PIPELINE_REGISTRY_URL"),
        ({"PIPELINE_REGISTRY_ANSWER_FRAMING": "registry"}, "ANSWER_FRAMING=registry needs"),
        ({"PIPELINE_REGISTRY_ANSWER_FRAMING": "protobuf"}, "ANSWER_FRAMING='protobuf'"),
        ({"PIPELINE_REGISTRY_BASIC_AUTH_USER_INFO": "alice"}, "expected user:password"),
        ({"PIPELINE_REGISTRY_CA_FILE": "/nowhere.pem"}, "PIPELINE_REGISTRY_CA_FILE"),
        ({"PIPELINE_REGISTRY_RETRY_BACKOFF_MS": "0"}, "RETRY_BACKOFF_MS"),
    ],
)
def test_registry_settings_that_cannot_work_are_named(env: dict[str, str], named: str) -> None:
    from pipeline.errors import ConfigurationError

    with pytest.raises(ConfigurationError) as err:
        Settings.from_env(env)
    assert named in str(err.value)


def test_registry_urls_and_secrets() -> None:
    s = Settings.from_env(
        {
            "PIPELINE_REGISTRY_URL": "http://a:8081/, https://b:8081",
            "PIPELINE_REGISTRY_BASIC_AUTH_USER_INFO": "alice:pw",
        }
    )
    assert s.registry.urls == ["http://a:8081", "https://b:8081"] and s.registry.enabled
    assert "alice" not in repr(s) and not Settings().registry.enabled
