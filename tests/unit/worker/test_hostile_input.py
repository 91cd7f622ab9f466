"""Hostile input: whatever the bytes, one answer each, no crash, bounded memory.

Three levels: the decoder and validator (hypothesis, property-based), the
worker's core with a fake model and broker (each input: exactly one result or
one dead letter, every offset released in order), and a real worker fed a few
hundred hostile records (the ledger). An atheris run fuzzes ``parse`` with
coverage guidance when atheris is installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import random
import subprocess
import sys
import textwrap
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import require
from support.runtime import LengthEngine, settle, submit

from pipeline.codecs.avro import HEADER_LEN, MARKER, dead_letter_codec, request_codec, result_codec
from pipeline.codecs.writer import long_bytes as _varint  # Avro's zig-zag varint
from pipeline.errors import DecodeError, PermanentError, ValidationError
from pipeline.kafka.client import request_bytes
from pipeline.settings import LANES, Settings, ValidationSettings
from pipeline.worker.intake import parse
from pipeline.worker.publish import Publisher
from pipeline.worker.records import Incoming, Origin, Request
from pipeline.worker.runtime import Runtime

LIMITS = ValidationSettings()  # the defaults: 64 KiB payloads, 8192-character texts


def _avro_str(raw: bytes) -> bytes:
    return _varint(len(raw)) + raw


HEADER = MARKER + request_codec().current.fingerprint


def _body(rid: bytes, text: bytes, tail: bytes = b"\x00\x00\x00\x00") -> bytes:
    """A request body: request_id and text as raw bytes, then created=0,
    deadline=null, source="", metadata={} (unless ``tail`` says otherwise)."""
    return HEADER + _avro_str(rid) + _avro_str(text) + tail


# -- hostile payloads, as plain builders (also used with a seeded Random) ------


def _valid(rng: random.Random) -> bytes:
    text = rng.choice(["good film", "a bad movie", "the film is very good", "not good"])
    return request_bytes(f"{text} {rng.randrange(10**6)}", request_id=f"ok-{rng.random()}")[1]


def _truncated(rng: random.Random) -> bytes:
    value = _valid(rng)
    return value[: rng.randrange(len(value))]


def _unknown_fingerprint(rng: random.Random) -> bytes:
    return MARKER + rng.randbytes(8) + _valid(rng)[HEADER_LEN:]


def _huge_length(rng: random.Random) -> bytes:
    huge = _varint(rng.randrange(1 << 20, 1 << 62))
    return rng.choice([HEADER + huge, HEADER + _avro_str(b"r") + huge + b"x" * rng.randrange(64)])


def _invalid_utf8(rng: random.Random) -> bytes:
    bad = rng.choice([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"ok\x80"])
    return rng.choice([_body(b"r-utf8", bad), _body(bad, b"text")])


def _empty_text(rng: random.Random) -> bytes:
    return _body(b"r-empty", rng.choice([b"", b" ", b"\n\t  "]))


def _oversized_text(rng: random.Random) -> bytes:
    return _body(b"r-big", b"x" * (LIMITS.max_text_chars + rng.randrange(1, 2000)))


def _oversized_payload(rng: random.Random) -> bytes:
    return HEADER + rng.randbytes(LIMITS.max_payload_bytes + rng.randrange(1, 512))


def _nul_bytes(rng: random.Random) -> bytes:
    return rng.choice(
        [
            _body(b"r-nul", b"good\x00film"),
            _body(b"\x00", b"good film \x00"),
            b"\x00" * rng.randrange(1, 64),
            HEADER + b"\x00" * rng.randrange(1, 64),
        ]
    )


def _random_bytes(rng: random.Random) -> bytes:
    return rng.randbytes(rng.randrange(0, 300))


def _trailing(rng: random.Random) -> bytes:
    return _valid(rng) + rng.randbytes(rng.randrange(1, 16))


def _bad_map(rng: random.Random) -> bytes:
    # metadata map with a huge (or negative, with a byte size) block count
    count = rng.choice([1 << 40, -(1 << 40)])
    tail = b"\x00\x00\x00" + _varint(count) + (_varint(8) if count < 0 else b"") + b"\x02k\x02v"
    return _body(b"r-map", b"good film", tail)


BUILDERS: list[Callable[[random.Random], bytes]] = [
    _valid,
    _truncated,
    _unknown_fingerprint,
    _huge_length,
    _invalid_utf8,
    _empty_text,
    _oversized_text,
    _oversized_payload,
    _nul_bytes,
    _random_bytes,
    _trailing,
    _bad_map,
]


@st.composite
def hostile(draw: st.DrawFn) -> bytes:
    """One hostile (or, now and then, valid) request value."""
    kind = draw(st.sampled_from(BUILDERS))
    seed = draw(st.integers(0, 2**32 - 1))
    if kind is _random_bytes:
        return draw(st.binary(max_size=512))
    return kind(random.Random(seed))


def _parse(value: bytes | None) -> Request:
    return parse(
        value,
        lane="standard",
        lane_deadline_ms=2000,
        model_id="m@1",
        limits=LIMITS,
        received_at_ms=1,
    )


# -- decoder and validator --------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(hostile())
def test_hostile_bytes_become_a_request_or_a_permanent_error(value: bytes) -> None:
    try:
        req = _parse(value)
    except (DecodeError, ValidationError) as exc:
        assert exc.stage in {"decode", "validate"}
        return
    except PermanentError as exc:  # pragma: no cover - an undocumented error type
        pytest.fail(f"unexpected {exc!r}")
    assert req.text.strip() and len(req.text) <= LIMITS.max_text_chars
    assert len(value) <= LIMITS.max_payload_bytes


@pytest.mark.parametrize(
    ("builder", "stage"),
    [
        (_truncated, "decode"),
        (_unknown_fingerprint, "decode"),
        (_huge_length, "decode"),
        (_invalid_utf8, "decode"),
        (_empty_text, "validate"),
        (_oversized_text, "validate"),
        (_oversized_payload, "validate"),
        (_trailing, "decode"),
        (_bad_map, "decode"),
    ],
)
def test_each_kind_of_hostile_input_fails_at_its_stage(
    builder: Callable[[random.Random], bytes], stage: str
) -> None:
    rng = random.Random(11)
    for _ in range(20):
        with pytest.raises(PermanentError) as info:
            _parse(builder(rng))
        assert info.value.stage == stage, info.value


def test_nul_bytes_in_text_are_accepted_and_elsewhere_rejected() -> None:
    assert _parse(_body(b"r-nul", b"good\x00film")).text == "good\x00film"
    assert _parse(_body(b"\x00", b"x")).request_id == "\x00"
    for value in (b"\x00" * 10, HEADER + b"\x00" * 10):
        with pytest.raises(DecodeError):
            _parse(value)


# -- memory bounded by the size caps ------------------------------------------------

#: Decoding a payload may allocate at most this multiple of its size. Measured
#: (tracemalloc peak / payload size): about 21 for 64 KiB of 3-byte map entries
#: (some 20,000 Python strings and dict slots), at most 3 for the others.
MEMORY_FACTOR = 32


def _peak(fn: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        with contextlib.suppress(PermanentError):
            fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def _payloads_64k() -> dict[str, bytes]:
    size = LIMITS.max_payload_bytes
    n = 20_000  # distinct one- and two-character keys, empty values: ~3 bytes per entry
    keys = [chr(0x21 + i % 90) + chr(0x21 + i // 90) for i in range(n)]
    entries = b"".join(_avro_str(k.encode()) + b"\x00" for k in keys)
    map_tail = b"\x00\x00\x00" + _varint(n) + entries + b"\x00"
    payloads = {
        "huge declared length": HEADER + _varint(1 << 60) + b"x" * (size - 20),
        "huge array count": _body(b"r", b"t", b"\x00\x00\x00" + _varint(1 << 40) + b"\x00" * 60000),
        "random bytes": random.Random(3).randbytes(size),
        "random body": HEADER + random.Random(4).randbytes(size - HEADER_LEN),
        "many map entries": _body(b"r", b"good film", map_tail)[:size],
        "long text": _body(b"r", b"y" * (size - 40)),
    }
    for name, value in payloads.items():
        assert len(value) <= size, (name, len(value))
    return payloads


@pytest.mark.parametrize("name", sorted(_payloads_64k()))
def test_decoding_a_64k_hostile_payload_allocates_bounded_memory(name: str) -> None:
    value = _payloads_64k()[name]
    request_codec()  # schemas loaded before measuring
    peak = _peak(lambda: _parse(value))
    assert peak <= MEMORY_FACTOR * len(value), f"{name}: peak {peak} bytes for {len(value)}"


def test_payload_over_the_cap_is_rejected_without_decoding() -> None:
    value = HEADER + b"\x02" * (4 * 1024 * 1024)
    request_codec()
    peak = _peak(lambda: _parse(value))
    assert peak < 16 * 1024, peak


# -- the worker's core: one answer per input, offsets released in order ------------


Answered = tuple[list[Any], list[Any], list[int]]


async def _through_runtime(values: list[tuple[str, bytes]]) -> Answered:
    sent: list[tuple[str, bytes]] = []
    acked: list[int] = []

    async def send(topic: str, key: bytes | None, value: bytes) -> asyncio.Future[None]:
        sent.append((topic, value))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def ack(token: Any) -> None:
        acked.append(token)

    s = Settings.from_env({})
    runtime = Runtime(
        s,
        engine=LengthEngine(),  # type: ignore[arg-type]
        publisher=Publisher(send, results_topic="res", dlq_topic="dlq"),
        ack=ack,
    )
    loop_task = asyncio.ensure_future(runtime.run())
    try:
        for offset, (lane, value) in enumerate(values):
            origin = Origin(
                topic=f"lane.{lane}",
                partition=0,
                offset=offset,
                timestamp_ms=0,
                key=None,
                value=value,
            )
            await submit(runtime, Incoming(lane=lane, origin=origin, token=offset))
        # Settled: every task the runtime spawned has ended, so nothing more arrives.
        await settle(runtime, loop_task, lambda: len(acked) == len(values))
    finally:
        loop_task.cancel()
        await runtime.close(1.0)
    results = [result_codec().decode(v) for t, v in sent if t == "res"]
    letters = [dead_letter_codec().decode(v) for t, v in sent if t == "dlq"]
    return results, letters, acked


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["standard", "bulk"]), hostile()), max_size=25))
def test_worker_core_answers_each_hostile_input_exactly_once(
    values: list[tuple[str, bytes]],
) -> None:
    results, letters, acked = asyncio.run(_through_runtime(values))
    # Offsets share one partition per lane topic here; all were released.
    assert sorted(acked) == list(range(len(values)))
    assert len(results) + len(letters) == len(values), (len(results), len(letters))
    lettered = {d["original_offset"] for d in letters}
    assert len(lettered) == len(letters), "an input was dead-lettered twice"
    for offset, (_lane, value) in enumerate(values):
        try:
            _parse(value)
        except PermanentError:
            assert offset in lettered, offset
        else:
            assert offset not in lettered, offset


# -- a real worker fed hostile records ------------------------------------------------


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_real_worker_answers_hundreds_of_hostile_records(
    kafka_bootstrap: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from harness import Deployment
    from ledger import check_ledger
    from tiny_model import build_tiny_bert

    from pipeline.kafka.client import RequestProducer

    model = build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))
    dep = Deployment.create(
        kafka_bootstrap,
        tmp_path,
        PIPELINE_MODEL_PATH=str(model),
        PIPELINE_MODEL_TORCH_THREADS="1",
    )
    rng = random.Random(2024)
    n = 300
    with dep.worker(), RequestProducer(dep.settings) as producer:
        for i in range(n):
            value = rng.choice(BUILDERS)(rng)
            key = rng.choice([None, b"", rng.randbytes(rng.randrange(1, 40)), b"k%d" % i])
            producer.send_raw(rng.choice(LANES), key, value)
        producer.flush()
        summary = check_ledger(dep.settings, max_duplicates=0, expect_inputs=n, timeout_s=120)
    assert summary["duplicates"] == 0
    assert summary["results"] + summary["dead_letters"] == n
    print(f"\nLEDGER hostile-input: {summary}")


# -- atheris: coverage-guided fuzzing of parse, when installed -----------------------

_FUZZ = """
import sys
import atheris

with atheris.instrument_imports():
    from pipeline.errors import DecodeError, ValidationError
    from pipeline.worker.intake import parse
    from pipeline.settings import ValidationSettings

LIMITS = ValidationSettings()

def one_input(data: bytes) -> None:
    try:
        parse(data, lane="bulk", lane_deadline_ms=1000, model_id="m@1", limits=LIMITS,
              received_at_ms=1)
    except (DecodeError, ValidationError):
        pass

atheris.Setup(sys.argv, one_input)
atheris.Fuzz()
"""


def test_atheris_fuzzes_parse_without_a_crash(tmp_path: Path) -> None:
    require(importlib.util.find_spec("atheris"), "atheris (a dev dependency: ./run setup)")
    script = tmp_path / "fuzz_parse.py"
    script.write_text(textwrap.dedent(_FUZZ))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(5)
    for i, build in enumerate(BUILDERS):
        (corpus / f"seed{i}").write_bytes(build(rng)[:8192])
    done = subprocess.run(
        [sys.executable, str(script), "-runs=20000", "-max_len=8192", "-timeout=10", str(corpus)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
