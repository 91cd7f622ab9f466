"""The catalogue of every metric family the pipeline exports: names, help, buckets
and the label values known in advance. :mod:`pipeline.observability.metrics`
records them; ``ops/grafana`` and ``ops/prometheus/alerts.yml`` may name only
the families listed in :data:`FAMILIES` (``tests/unit/observability/test_metrics.py``
checks it).
"""

from __future__ import annotations

__all__ = [
    "BATCH_LATENCY_BUCKETS",
    "BATCH_SIZE_BUCKETS",
    "BREAKER_STATES",
    "DEDUPE_LEVELS",
    "FAMILIES",
    "LATENCY_BUCKETS",
    "PADDING_BUCKETS",
    "PASSED_HOW",
    "PREFIX",
    "REASONS",
    "RECOVERY_ACTIONS",
    "REGISTRY_OUTCOMES",
    "SERVED",
    "STALL_BUCKETS",
    "TOKEN_BUCKETS",
]

PREFIX = "pipeline_"

# End-to-end and queue-wait latency, seconds. 0.2 is a bucket edge so the
# realtime SLA (200 ms) can be read exactly from `le="0.2"`.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
    0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip
# One model call, seconds: from a few ms (tiny CPU batch) to seconds (huge batch).
BATCH_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2,
    0.3, 0.5, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256)
TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
PADDING_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
STALL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5)

SERVED = ("computed", "stored", "inflight", "batch")
DEDUPE_LEVELS = ("batch", "inflight", "stored")
REASONS = ("deadline", "aged", "full", "window", "expired")
BREAKER_STATES = ("closed", "open", "half_open")
PASSED_HOW = ("log", "seeks")
RECOVERY_ACTIONS = ("read-again", "let-go")

# name -> (type, help). Counters are listed without `_total`, as
# prometheus_client names them; histograms expose _bucket/_count/_sum.
FAMILIES: dict[str, tuple[str, str]] = {
    "pipeline_requests_received": ("counter", "requests consumed from a lane topic"),
    "pipeline_requests_completed": ("counter", "results published, by lane and how served"),
    "pipeline_dead_letters": ("counter", "dead letters published, by stage and lane"),
    "pipeline_requests_expired": ("counter", "requests dead-lettered: deadline passed first"),
    "pipeline_deadline_missed": ("counter", "results published after their deadline"),
    "pipeline_dedupe_hits": ("counter", "requests answered without the model, by level"),
    "pipeline_request_latency_seconds": (
        "histogram",
        "request created to result published, by lane",
    ),
    "pipeline_queue_wait_seconds": ("histogram", "arrival to batch dispatch, by lane"),
    "pipeline_batches": ("counter", "model batches run, by dispatch reason"),
    "pipeline_batch_size": ("histogram", "requests per model batch"),
    "pipeline_batch_padded_tokens": ("histogram", "padded tokens per model batch"),
    "pipeline_batch_padding_ratio": ("histogram", "share of a batch's tokens that is padding"),
    "pipeline_batch_latency_seconds": ("histogram", "run time of one model batch"),
    "pipeline_tokens_real": ("counter", "real (unpadded) tokens the model computed"),
    "pipeline_tokens_padded": ("counter", "tokens the model computed, padding included"),
    "pipeline_queue_depth": ("gauge", "requests waiting in a lane's queue"),
    "pipeline_inflight_requests": ("gauge", "requests accepted but not yet acknowledged"),
    "pipeline_oldest_unreleased_input_seconds": (
        "gauge",
        "age of the oldest input accepted but not yet released (0 when none): a stuck input",
    ),
    "pipeline_token_budget": ("gauge", "current padded-token budget of a batch"),
    "pipeline_token_budget_changes": ("counter", "budget changes by the controller"),
    "pipeline_lane_paused": ("gauge", "1 while a lane's topic is paused (backpressure)"),
    "pipeline_lane_offsets_passed": (
        "counter",
        "lane offsets holding no record, passed: how=log (the fetch walked past them: "
        "a transaction marker, an aborted or compacted record), how=seeks (confirmed by "
        "repeated seeks back)",
    ),
    "pipeline_dedupe_recovery_stalls": (
        "counter",
        "changelog partitions of the stored results whose recovery received nothing for "
        "PIPELINE_DEDUPE_RECOVERY_STALL_S: action=read-again (sought again), action=let-go "
        "(recovery ended without their results)",
    ),
    "pipeline_device_utilisation_ratio": ("gauge", "GPU utilisation, 0..1 (NVML)"),
    "pipeline_device_memory_used_bytes": ("gauge", "GPU memory in use"),
    "pipeline_device_memory_total_bytes": ("gauge", "GPU memory in all"),
    "pipeline_engine_busy_ratio": ("gauge", "share of recent time the engine thread computed"),
    "pipeline_model_forward_seconds": (
        "counter",
        "wall time of the model's forwards, measured where the network runs",
    ),
    "pipeline_model_lock_wait_seconds": (
        "counter",
        "of the forwards' time, the network's thread waiting for the interpreter lock "
        "(known on the simulated device only)",
    ),
    "pipeline_model_process_restarts": ("counter", "model processes started again after one died"),
    "pipeline_consumer_lag": ("gauge", "records behind the partition's end (highwater)"),
    "pipeline_breaker_state": ("gauge", "1 for the circuit breaker's current state"),
    "pipeline_shed_level": ("gauge", "load-shedding level, 0 (none) to 3 (see degrade.py)"),
    "pipeline_event_loop_lag_seconds": (
        "histogram",
        "how late the event loop woke for a timer: time it could serve nothing",
    ),
    "pipeline_gc_pause_seconds": (
        "histogram",
        "garbage-collection pauses by generation (every Python thread stands still)",
    ),
    "pipeline_model": ("info", "the model this worker serves"),
    "pipeline_registry_waiting_schemas": (
        "gauge",
        "schema ids whose records wait because the Schema Registry does not answer",
    ),
    "pipeline_registry_lookups": (
        "counter",
        "writer-schema lookups in the Schema Registry, by outcome (found, unknown, unavailable)",
    ),
}

REGISTRY_OUTCOMES = ("found", "unknown", "unavailable")
