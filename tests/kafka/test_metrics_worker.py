"""A real worker serves /metrics after real traffic (needs the runtime wiring of
pipeline.observability.metrics in pipeline/worker/runtime.py and pipeline/app.py)."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest
from harness import Deployment
from prometheus_client.parser import text_string_to_metric_families
from support.kafka import end_offsets
from transformers import AutoTokenizer

from pipeline.inference import default_model_path
from pipeline.kafka.client import RequestProducer
from pipeline.tools.supervise import free_port

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.slow,
]


def _scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def _total(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= lab)


def test_worker_metrics_after_real_traffic(kafka_bootstrap: str, tmp_path: Path) -> None:
    dep = Deployment.create(kafka_bootstrap, tmp_path)
    port = free_port()
    texts = [f"metrics check text number {i}" for i in range(6)]
    lanes = [dep.settings.topics.lane_topic(lane) for lane in ("realtime", "standard", "bulk")]
    with (
        dep.worker(PIPELINE_METRICS_PORT=str(port), PIPELINE_METRICS_SAMPLE_INTERVAL_S="0.2"),
        RequestProducer(dep.settings) as producer,
    ):
        for i, text in enumerate(texts):
            producer.send(text, lane=("realtime", "standard", "bulk")[i % 3])
        producer.send(texts[0], lane="bulk")  # a repeat: answered without the model
        producer.send_raw("standard", b"k", b"\x00garbage")  # a dead letter, stage decode
        producer.flush()
        dep.answers(expect=len(texts) + 2)
        # Counters are bumped after the broker acknowledged; give one scrape's slack.
        deadline = time.monotonic() + 15
        while True:
            samples = _scrape(port)
            if _total(samples, "pipeline_requests_completed_total") >= len(texts) + 1:
                break
            assert time.monotonic() < deadline, "results never counted"
            time.sleep(0.5)
        # Consumer lag (pipeline/observability/sampling.py): once the answered inputs are committed,
        # every lane partition that got records reports a lag of 0.
        with_records = {tp for tp, end in end_offsets(kafka_bootstrap, lanes).items() if end}
        deadline = time.monotonic() + 30
        while True:
            lag = {
                (dict(labels)["topic"], int(dict(labels)["partition"])): v
                for (n, labels), v in _scrape(port).items()
                if n == "pipeline_consumer_lag" and dict(labels)["topic"] in lanes
            }
            if with_records <= set(lag) and not any(lag.values()):
                break
            assert time.monotonic() < deadline, f"lane lag never read 0: {lag}, {with_records}"
            time.sleep(0.2)

    assert _total(samples, "pipeline_requests_received_total") == len(texts) + 2
    for lane in ("realtime", "standard", "bulk"):
        assert _total(samples, "pipeline_requests_received_total", lane=lane) >= 2
        # One latency observation per request completed in the lane.
        assert _total(samples, "pipeline_request_latency_seconds_count", lane=lane) == _total(
            samples, "pipeline_requests_completed_total", lane=lane
        ), lane
    assert _total(samples, "pipeline_requests_completed_total", served="computed") == len(texts)
    assert _total(samples, "pipeline_dedupe_hits_total") == 1
    assert _total(samples, "pipeline_dead_letters_total", stage="decode", lane="standard") == 1
    assert _total(samples, "pipeline_batch_size_count") >= 1
    # The repeat may ride in its twin's batch (served=batch) or skip batching (stored).
    assert len(texts) <= _total(samples, "pipeline_batch_size_sum") <= len(texts) + 1
    assert _total(samples, "pipeline_batch_latency_seconds_count") == _total(
        samples, "pipeline_batch_size_count"
    )
    # Tokens as the model computed them (each text once): on a CPU a batch is padded
    # to its longest text, and these texts are all as long (the scheduler's bucket
    # would say 16 each).
    tokenizer = AutoTokenizer.from_pretrained(default_model_path(), local_files_only=True)
    real = _total(samples, "pipeline_tokens_real_total")
    assert real == sum(len(tokenizer(t)["input_ids"]) for t in texts)
    assert _total(samples, "pipeline_tokens_padded_total") == real
    assert ("pipeline_engine_busy_ratio", frozenset()) in samples
    assert _total(samples, "pipeline_event_loop_lag_seconds_count") > 0  # the probe runs
    assert any(n == "pipeline_gc_pause_seconds_count" for n, _ in samples)
    assert any(n == "pipeline_queue_depth" for n, _ in samples)
    assert any(n == "pipeline_model_info" for n, _ in samples)
