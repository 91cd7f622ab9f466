"""pipeline.observability.metrics: the facade records what it is told, and /metrics serves it."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.ops import populated

from pipeline.errors import ConfigurationError
from pipeline.observability.metrics import (
    FAMILIES,
    LATENCY_BUCKETS,
    PREFIX,
    PipelineMetrics,
    start_metrics_server,
)
from pipeline.settings import MetricsSettings, Settings
from pipeline.tools.supervise import free_port


def exposed_families(m: PipelineMetrics) -> dict[str, set[str]]:
    """family name -> the sample names it exposes (``_total``, ``_bucket``, ...)."""
    return {fam.name: {s.name for s in fam.samples} for fam in m.registry.collect()}


def test_every_family_is_prefixed_typed_and_exported() -> None:
    m = populated()
    families = exposed_families(m)
    ours = {name for name in families if name.startswith(PREFIX)}
    assert ours == set(FAMILIES)
    kinds = {fam.name: fam.type for fam in m.registry.collect()}
    for name, (kind, help_) in FAMILIES.items():
        assert kinds[name] == kind, name
        assert help_
        assert families[name], name
    # The text exposition parses, and names the same families.
    parsed = {f.name for f in text_string_to_metric_families(generate_latest(m.registry).decode())}
    assert {n for n in FAMILIES if n != "pipeline_model"} <= parsed


def test_requests_results_and_dead_letters_are_counted_by_label() -> None:
    m = populated()
    assert m.value("pipeline_requests_received_total", {"lane": "realtime"}) == 2
    assert m.value("pipeline_requests_received_total", {"lane": "standard"}) == 0
    served = {"lane": "realtime", "served": "stored"}
    assert m.value("pipeline_requests_completed_total", served) == 1
    assert m.value("pipeline_dead_letters_total", {"stage": "decode", "lane": "standard"}) == 1
    # A dead letter of stage expired is also an expiry; expired() counts the others.
    assert m.value("pipeline_requests_expired_total", {"lane": "realtime"}) == 1
    assert m.value("pipeline_requests_expired_total", {"lane": "bulk"}) == 1
    # late=True and deadline_missed() both count a missed deadline.
    assert m.value("pipeline_deadline_missed_total", {"lane": "realtime"}) == 1
    assert m.value("pipeline_deadline_missed_total", {"lane": "standard"}) == 1


def test_dedupe_hits_come_from_the_served_field() -> None:
    m = populated()
    assert m.value("pipeline_dedupe_hits_total", {"level": "stored"}) == 1
    assert m.value("pipeline_dedupe_hits_total", {"level": "batch"}) == 1
    assert m.value("pipeline_dedupe_hits_total", {"level": "inflight"}) == 1


def test_latency_histogram_has_the_realtime_sla_as_a_bucket_edge() -> None:
    assert 0.2 in LATENCY_BUCKETS
    m = populated()
    rt = {"lane": "realtime"}
    assert m.value("pipeline_request_latency_seconds_count", rt) == 2
    assert m.value("pipeline_request_latency_seconds_bucket", {**rt, "le": "0.2"}) == 1
    assert m.value("pipeline_request_latency_seconds_sum", rt) == pytest.approx(0.47)
    assert m.value("pipeline_queue_wait_seconds_count", rt) == 1


def test_batch_records_size_tokens_padding_latency_and_reason() -> None:
    m = populated()
    assert m.value("pipeline_batches_total", {"reason": "full"}) == 1
    assert m.value("pipeline_batch_size_sum") == 8
    assert m.value("pipeline_batch_padded_tokens_sum") == 256
    assert m.value("pipeline_tokens_real_total") == 150
    assert m.value("pipeline_tokens_padded_total") == 256
    assert m.value("pipeline_batch_padding_ratio_sum") == pytest.approx(1 - 150 / 256)
    assert m.value("pipeline_batch_latency_seconds_bucket", {"le": "0.035"}) == 1
    assert m.value("pipeline_batch_latency_seconds_bucket", {"le": "0.02"}) == 0


def test_an_empty_batch_records_no_padding() -> None:
    m = PipelineMetrics(process_collectors=False)
    m.batch(size=0, real_tokens=0, padded_tokens=0, latency_s=0.0)
    assert m.value("pipeline_batch_padding_ratio_count") == 0
    assert m.value("pipeline_batch_size_count") == 1


def test_gauges_hold_the_last_reading() -> None:
    m = populated()
    assert m.value("pipeline_queue_depth", {"lane": "bulk"}) == 17
    assert m.value("pipeline_queue_depth", {"lane": "realtime"}) == 0
    assert m.value("pipeline_inflight_requests") == 25
    assert m.value("pipeline_token_budget") == 512
    assert m.value("pipeline_token_budget_changes_total", {"direction": "shrink"}) == 1
    assert m.value("pipeline_lane_paused", {"lane": "bulk"}) == 1
    m.paused("bulk", False)
    assert m.value("pipeline_lane_paused", {"lane": "bulk"}) == 0
    assert m.value("pipeline_device_utilisation_ratio") == pytest.approx(0.42)
    m.device(73.0, 1, 2)  # a percentage is scaled to 0..1
    assert m.value("pipeline_device_utilisation_ratio") == pytest.approx(0.73)
    assert m.value("pipeline_device_memory_total_bytes") == 2
    assert m.value("pipeline_engine_busy_ratio") == pytest.approx(0.9)


def test_consumer_lag_per_partition_and_forgotten_on_revoke() -> None:
    m = populated()
    labels = {"topic": "inference.requests.bulk", "partition": "2"}
    assert m.value("pipeline_consumer_lag", labels) == 1234
    m.forget_partition("inference.requests.bulk", 2)
    m.forget_partition("inference.requests.bulk", 2)  # twice is fine
    assert m.value("pipeline_consumer_lag", labels) is None


def test_breaker_state_is_one_hot() -> None:
    m = populated()
    assert m.value("pipeline_breaker_state", {"state": "open"}) == 1
    assert m.value("pipeline_breaker_state", {"state": "closed"}) == 0
    m.breaker_state("half_open")
    states = {s: m.value("pipeline_breaker_state", {"state": s}) for s in ("open", "half_open")}
    assert states == {"open": 0, "half_open": 1}


def test_model_info_and_process_metrics() -> None:
    m = populated()
    info = {"name": "all-MiniLM-L6-v2", "version": "1", "device": "cpu", "task": "embed"}
    assert m.value("pipeline_model_info", info) == 1
    assert "process_cpu_seconds_total" in generate_latest(m.registry).decode()


def test_two_facades_do_not_share_a_registry() -> None:
    a, b = PipelineMetrics(), PipelineMetrics()
    a.arrived("bulk")
    assert b.value("pipeline_requests_received_total", {"lane": "bulk"}) == 0


def test_metrics_settings_defaults_and_env() -> None:
    s = Settings.from_env({}).metrics
    assert (s.enabled, s.host, s.port) == (True, "127.0.0.1", 9108)
    env = {"PIPELINE_METRICS_PORT": "0", "PIPELINE_METRICS_HOST": "0.0.0.0"}
    assert Settings.from_env(env).metrics.port == 0
    with pytest.raises(ConfigurationError):
        Settings.from_env({"PIPELINE_METRICS_PORT": "70000"})


def test_server_serves_metrics_over_http_and_stops() -> None:
    m = populated()
    port = free_port()
    server = start_metrics_server(MetricsSettings(host="127.0.0.1", port=port), m)
    assert server is not None
    try:
        assert server.url == f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(server.url, timeout=5) as resp:
            body = resp.read().decode()
        assert 'pipeline_requests_received_total{lane="realtime"} 2.0' in body
        assert "pipeline_batch_size_bucket" in body
    finally:
        server.close()
        server.close()  # idempotent
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_server_disabled_by_port_zero_or_flag() -> None:
    m = PipelineMetrics(process_collectors=False)
    assert start_metrics_server(MetricsSettings(port=0), m) is None
    assert start_metrics_server(MetricsSettings(enabled=False, port=free_port()), m) is None


def test_server_on_a_taken_port_names_the_setting() -> None:
    m = PipelineMetrics(process_collectors=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigurationError, match="PIPELINE_METRICS_PORT"):
            start_metrics_server(MetricsSettings(port=port), m)


def test_label_sets_do_not_grow_with_distinct_inputs_or_partitions_revoked() -> None:
    """Every label value a worker records comes from a closed set (lanes, served levels,
    stages, reasons, how offsets were passed), except the lag's topic/partition, which
    is dropped when the partition is revoked. A day's worth of distinct requests and
    reassignments leaves the series count where it started."""
    from pipeline.observability.metrics import PipelineMetrics

    m = PipelineMetrics(process_collectors=False)

    def series() -> int:
        return sum(
            1
            for line in generate_latest(m.registry).decode().splitlines()
            if not line.startswith("#")
        )

    for i in range(200):  # warm: every closed set seen once
        m.arrived("bulk")
        m.completed("bulk", ("computed", "stored", "inflight", "batch")[i % 4], 0.01)
        m.dead_letter(("decode", "validate", "infer", "expired", "publish")[i % 5], "bulk")
        m.batch(8, 64, 80, 0.01, ("deadline", "aged", "full", "window", "expired")[i % 5])
        m.offsets_passed(1, i % 2 == 0)
    m.consumer_lag("lane", 0, 5)
    before = series()
    for i in range(20_000):
        lane = ("realtime", "standard", "bulk")[i % 3]
        m.arrived(lane)
        m.completed(lane, "computed", i / 1e4)
        m.dead_letter("validate", lane)
        m.offsets_passed(2, i % 2 == 0)
        partition = 1 + i % 50
        m.consumer_lag("lane", partition, i)  # assigned ...
        m.forget_partition("lane", partition)  # ... then revoked
    assert series() == before
