"""The modes under test: worker settings per mode, a deployment per mode, and ``raw``.

Worker modes run the real ``faust -A pipeline.app worker`` process, each with
its own topic prefix, app id, data folder and ports:

- ``sync``: one request per model call (max items 1, no window, no stored
  dedupe), budget fixed;
- ``fixed``: a fixed batch size and wait, one sequence bucket (no length
  bucketing), no realtime reservation, the ``fixed`` policy (no adaptation).
  Lanes and deadlines are still honoured (the scheduler always orders by lane,
  then deadline, which within a lane is arrival order);
- ``adaptive``: the defaults;

Every mode runs with load shedding off (``PIPELINE_DEGRADE_ENABLED=false``):
the saturation phases build a backlog on purpose.
- ``noop``: the defaults with the ``noop`` model (the pipeline's own cost).

``raw`` is the model alone in this process: texts sorted by length within
windows of 256, batched at the best of a few sizes, no Kafka.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipeline.bench.drive import Collector
from pipeline.bench.stats import ProcProbe
from pipeline.settings import ModelSettings, Settings
from pipeline.supervise import WorkerProcess, free_port
from pipeline.topics import create_topics

__all__ = ["WORKER_MODES", "Deployment", "mode_env", "run_raw"]

WORKER_MODES = ("adaptive", "fixed", "sync", "noop")


def mode_env(mode: str, *, fixed_batch: int, fixed_wait_ms: int, max_length: int) -> dict[str, str]:
    """The PIPELINE_* overrides that make a worker behave as ``mode``."""
    if mode == "sync":
        return {
            "PIPELINE_SCHEDULER_MAX_ITEMS": "1",
            "PIPELINE_SCHEDULER_WINDOW_MS": "0",
            "PIPELINE_SCHEDULER_POLICY": "fixed",
            "PIPELINE_DEDUPE_ENABLED": "false",
        }
    if mode == "fixed":
        budget = str(fixed_batch * max_length)
        return {
            "PIPELINE_SCHEDULER_MAX_ITEMS": str(fixed_batch),
            "PIPELINE_SCHEDULER_WINDOW_MS": str(fixed_wait_ms),
            "PIPELINE_SCHEDULER_POLICY": "fixed",
            "PIPELINE_SCHEDULER_SEQ_BUCKETS": str(max_length),
            "PIPELINE_SCHEDULER_TOKEN_BUDGET": budget,
            "PIPELINE_SCHEDULER_TOKEN_BUDGET_MIN": budget,
            "PIPELINE_SCHEDULER_TOKEN_BUDGET_MAX": budget,
            "PIPELINE_SCHEDULER_REALTIME_SHARE": "0",
        }
    if mode == "noop":
        return {"PIPELINE_MODEL_TASK": "noop"}
    if mode == "adaptive":
        return {}
    raise ValueError(f"unknown worker mode {mode!r}")


class Deployment:
    """One mode's topics, worker process, answer collector and probes."""

    def __init__(self, mode: str, *, bootstrap: str, out: Path, extra_env: dict[str, str]) -> None:
        tag = uuid.uuid4().hex[:8]
        self.mode = mode
        self.metrics_port = free_port()
        self.env = {
            "PIPELINE_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "PIPELINE_TOPICS_PREFIX": f"bench-{mode}-{tag}.",
            "PIPELINE_WORKER_APP_ID": f"pipeline-bench-{mode}-{tag}",
            "PIPELINE_WORKER_DATA_DIR": str(out / "work" / f"{mode}-{tag}"),
            "PIPELINE_WORKER_WEB_PORT": str(free_port()),
            "PIPELINE_METRICS_PORT": str(self.metrics_port),
            "PIPELINE_METRICS_SAMPLE_INTERVAL_S": "1",
            # A saturation phase dumps a backlog on purpose: load shedding would pause
            # bulk for its hold time (15 s) and measure that timer, not the pipeline.
            "PIPELINE_DEGRADE_ENABLED": "false",
            **extra_env,
        }
        self.settings = Settings.from_env(self.env)
        create_topics(self.settings)
        self.log_path = out / "work" / f"{mode}-{tag}.log"
        self.worker: WorkerProcess | None = None
        self.collector: Collector | None = None
        self.probe: ProcProbe | None = None
        self.ready_s = 0.0

    def start(self, timeout_s: float = 300.0) -> None:
        self.collector = Collector(self.settings)
        self.worker = WorkerProcess.start(self.env, self.log_path)
        self.probe = ProcProbe(self.worker.pid)
        self.ready_s = self.worker.wait_ready(timeout_s)

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        if self.collector is not None:
            self.collector.close()


def _length_sorted(texts: Sequence[str], count: Callable[[str], int], window: int) -> list[str]:
    out: list[str] = []
    for i in range(0, len(texts), window):
        out += sorted(texts[i : i + window], key=count)
    return out


def _run_batches(model: Any, texts: Sequence[str], size: int) -> dict[str, float]:
    tokenize_s = forward_s = 0.0
    real = padded = batches = 0
    start = time.perf_counter()
    for i in range(0, len(texts), size):
        t0 = time.perf_counter()
        enc = model.tokenize(list(texts[i : i + size]))
        t1 = time.perf_counter()
        model.forward(enc)
        t2 = time.perf_counter()
        tokenize_s += t1 - t0
        forward_s += t2 - t1
        real += enc.n_tokens
        padded += enc.padded_tokens
        batches += 1
    wall = time.perf_counter() - start
    return {
        "throughput": len(texts) / wall if wall else 0.0,
        "elapsed_s": wall,
        "batches": float(batches),
        "mean_batch_size": len(texts) / batches if batches else 0.0,
        "mean_batch_tokens": padded / batches if batches else 0.0,
        "padding_ratio": 1 - real / padded if padded else 0.0,
        "tokenize_share": tokenize_s / (tokenize_s + forward_s) if forward_s else 0.0,
    }


def run_raw(
    model_settings: ModelSettings,
    texts: Sequence[str],
    *,
    sizes: Sequence[int],
    sweep_n: int = 128,
) -> dict[str, Any]:
    """The model alone: pick the best of ``sizes`` on the first ``sweep_n`` texts,
    then run every text at that size, sorted by length within windows of 256."""
    from pipeline.inference import load_model

    model = load_model(model_settings)
    model.predict(["warm-up"])
    ordered = _length_sorted(texts, len, 256)
    sample = _length_sorted(texts[:sweep_n], len, 256)
    sweep = {size: _run_batches(model, sample, size)["throughput"] for size in sizes}
    best = max(sweep, key=lambda s: sweep[s])
    result: dict[str, Any] = _run_batches(model, ordered, best)
    result |= {
        "best_batch_size": best,
        "sweep": {str(k): v for k, v in sweep.items()},
        "device": str(model.device),
        "sent": len(texts),
        "answered": len(texts),
    }
    return result


def model_settings_for(settings: Settings, device: str | None) -> ModelSettings:
    """The bench's model: the settings' own, on ``device`` when one was asked for."""
    model = settings.model
    return dataclasses.replace(model, device=device) if device else model
