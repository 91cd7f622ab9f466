"""A real worker reports the lag behind an offset it cannot commit past (kafka, slow):
the sampling itself, with stand-ins, is in tests/unit/observability/test_sampling.py."""

from __future__ import annotations

import signal
import time
import urllib.request
from pathlib import Path

import pytest
from harness import Deployment
from prometheus_client.parser import text_string_to_metric_families

from pipeline.kafka.client import RequestProducer
from pipeline.tools.supervise import free_port

LAG = "pipeline_consumer_lag"  # unit/observability/test_sampling.py names it too


# -- a real worker -------------------------------------------------------------


def _scrape_lag(port: int, topic: str) -> dict[int, float]:
    """The worker's ``pipeline_consumer_lag`` of ``topic``'s partitions, from /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        int(s.labels["partition"]): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == LAG and s.labels["topic"] == topic
    }


@pytest.mark.kafka
@pytest.mark.slow
def test_worker_reports_the_lag_behind_an_offset_it_cannot_commit_past(
    kafka_bootstrap: str, tmp_path: Path, tiny_dir: Path
) -> None:
    """Offset 1 of a one-partition lane fails in the model and is retried for as long
    as the test runs, so the group's commit stops at 1 while the partition's end is
    ``total``: the worker must report a lag of exactly ``total - 1``."""
    dep = Deployment.create(
        kafka_bootstrap,
        tmp_path,
        partitions=1,
        PIPELINE_MODEL_PATH=str(tiny_dir),
        PIPELINE_MODEL_TORCH_THREADS="1",
        PIPELINE_MODEL_FAIL_ON="held back",
        PIPELINE_RETRY_MAX_ATTEMPTS="1000",
        PIPELINE_RETRY_BACKOFF_BASE_MS="1000",
        PIPELINE_RETRY_BACKOFF_MAX_MS="1000",
        PIPELINE_DEGRADE_ENABLED="false",
        PIPELINE_METRICS_SAMPLE_INTERVAL_S="0.2",
    )
    port = free_port()
    total, held_at = 6, 1
    # Not dep.worker(): a clean stop waits for every input to be answered, and the
    # held one never is, so the worker is killed when the test is done with it.
    worker = dep.spawn(PIPELINE_METRICS_PORT=str(port))
    try:
        worker.wait_ready()
        _hold_an_offset_and_read_the_lag(dep, port, total, held_at)
    finally:
        worker.signal(signal.SIGKILL)
        worker.proc.wait(30)


def _hold_an_offset_and_read_the_lag(dep: Deployment, port: int, total: int, held_at: int) -> None:
    lane = dep.settings.topics.lane_topic("bulk")
    with RequestProducer(dep.settings) as producer:
        for i in range(total):
            text = "this request is held back" if i == held_at else f"request {i} is a good film"
            producer.send(text, lane="bulk", request_id=f"r-{i}")
        producer.flush()
        answers = dep.answers(expect=total - 1)
        assert f"r-{held_at}" not in {a.record["request_id"] for a in answers}
        # The commit reaches the held offset within a commit interval (Faust's 2.8 s)
        # and stays there; the sampler reads it every 0.2 s.
        deadline = time.monotonic() + 30
        while (lag := _scrape_lag(port, lane)) != {0: total - held_at}:
            assert time.monotonic() < deadline, f"lag never read {total - held_at}: {lag}"
            time.sleep(0.2)
