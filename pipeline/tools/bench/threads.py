"""The thread budget's effect: throughput per thread setting, model alone and in a worker.

A setting is ``T[:K[:H]]``: ``T`` torch intra-op threads, ``K`` tokenizer
threads, ``H`` the worker's hand-over lead in ms (negative: one batch at a
time, no overlap); ``K`` and ``H`` default to the settings' own. ``0`` means
what it means in the settings (``T``: cores - 1; ``K``: the library's pool).

For each setting :func:`raw_threads` runs the model alone in a fresh process
(thread pools are fixed per process once used), at one batch size: serially
(tokenize, then forward) and pipelined through the engine (the next batch
tokenised while one computes), alternating the two over four slices of the
texts so that load from elsewhere weighs on both alike. ``run_bench`` adds an
adaptive worker's saturated throughput per setting, also per core-second of
CPU it got (on a shared machine the fairer figure).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["ThreadSetting", "parse_settings", "raw_threads"]


class ThreadSetting:
    """One point of the sweep, and the PIPELINE_* variables that make it."""

    def __init__(self, spec: str) -> None:
        parts = spec.strip().split(":")
        usage = f"{spec!r}: expected T[:K[:H]] (counts >= 0, H in ms), e.g. 1, 2:1 or 1:1:-1"
        try:
            if not 1 <= len(parts) <= 3:
                raise ValueError(usage)
            self.torch = int(parts[0])
            self.tokenizer = int(parts[1]) if len(parts) > 1 and parts[1] else None
            self.handover_ms = float(parts[2]) if len(parts) > 2 and parts[2] else None
        except ValueError:
            raise ValueError(usage) from None
        if self.torch < 0 or (self.tokenizer is not None and self.tokenizer < 0):
            raise ValueError(usage)
        self.spec = spec.strip()

    def env(self) -> dict[str, str]:
        out = {"PIPELINE_MODEL_TORCH_THREADS": str(self.torch)}
        if self.tokenizer is not None:
            out["PIPELINE_MODEL_TOKENIZER_THREADS"] = str(self.tokenizer)
        if self.handover_ms is not None:
            out["PIPELINE_SCHEDULER_HANDOVER_MS"] = str(self.handover_ms)
        return out


def parse_settings(value: str) -> tuple[str, ...]:
    """``"1,2:1,1:1:-1"`` -> its settings, each checked; raises ValueError."""
    specs = tuple(s.strip() for s in value.split(",") if s.strip())
    for spec in specs:
        ThreadSetting(spec)
    return specs


def raw_threads(
    setting: ThreadSetting, texts: Sequence[str], *, size: int, env: dict[str, str]
) -> dict[str, Any]:
    """The model alone under ``setting``, in a child process: serial and pipelined texts/s."""
    child_env = {**os.environ, **env, **setting.env()}
    done = subprocess.run(
        [sys.executable, "-c", "from pipeline.tools.bench.threads import _child; _child()"],
        input=json.dumps({"texts": list(texts), "size": size}),
        env=child_env,
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"thread probe {setting.spec} failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _child() -> None:
    """Run in the child: read texts, measure, print one JSON line."""
    from pipeline.inference import InferenceEngine, load_model
    from pipeline.inference.threads import apply_thread_budget
    from pipeline.settings import Settings

    job = json.loads(sys.stdin.read())
    texts, size = job["texts"], int(job["size"])
    settings = dataclasses.replace(Settings.from_env().model, process="off")  # the model alone
    model = load_model(settings)
    applied = apply_thread_budget(settings)
    batches = [texts[i : i + size] for i in range(0, len(texts), size)]
    engine = InferenceEngine(model)
    engine.start()

    def serial(part: list[list[str]]) -> float:
        t0 = time.perf_counter()
        for batch in part:
            model.forward(model.tokenize(batch))
        return time.perf_counter() - t0

    async def pipelined(part: list[list[str]]) -> float:
        room = asyncio.Semaphore(2)  # as the worker: one running, one being prepared

        async def one(batch: list[str]) -> None:
            async with room:
                await engine.run(batch)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(b) for b in part))
        return time.perf_counter() - t0

    serial_s = pipelined_s = 0.0
    try:
        serial(batches[:1])  # warm-up, both ways
        asyncio.run(pipelined(batches[:1]))
        step = max(1, -(-len(batches) // 4))
        for k, i in enumerate(range(0, len(batches), step)):
            part = batches[i : i + step]
            if k % 2:
                pipelined_s += asyncio.run(pipelined(part))
                serial_s += serial(part)
            else:
                serial_s += serial(part)
                pipelined_s += asyncio.run(pipelined(part))
    finally:
        engine.stop(timeout=60)
    print(
        json.dumps(
            {
                **applied,
                "batch_size": size,
                "texts": len(texts),
                "serial": len(texts) / serial_s,
                "pipelined": len(texts) / pipelined_s,
            }
        )
    )
