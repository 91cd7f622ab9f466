"""The model alone, no Kafka: ``raw`` and sentence-transformers' ``encode`` (``st``).

``raw`` is what a user of the model would write: the whole workload sorted by
token length, then cut into batches by a padded-token budget (rows x the
longest text's tokens, as TEI's queue does; sentence-transformers' ``encode``
sorts the same way), on the device's best dtype (the settings' ``auto``), in
this process (``PIPELINE_MODEL_PROCESS=off``: no pipe to cross; on ``sim`` an
in-process :class:`~pipeline.inference.sim.SimModel`). The budget is the best
of a few, each tried on a sample of the workload first.

``st`` is the anchor a user would pick instead:
``SentenceTransformer(folder, device=...).encode(texts, batch_size=...)`` on
the same texts, device and dtype, at the best of a few batch sizes (cpu and
cuda only: on ``sim`` there is no network for it to run).

Promises: :func:`token_batches` is pure; each run reports texts/s, the best
budget (or batch size) and its sweep, the mean batch size, padded tokens per
batch and padding.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

from pipeline.settings import ModelSettings

__all__ = ["run_raw", "run_st", "token_batches"]


def token_batches(lengths: Sequence[int], budget: int) -> list[range]:
    """Cut ``lengths`` (tokens per text, in the order they are batched) into
    consecutive batches: each takes texts while rows x its longest text stays
    within ``budget``, and at least one text (a text longer than the budget is
    a batch of its own). Sorted lengths waste the least padding."""
    out: list[range] = []
    start, n = 0, len(lengths)
    while start < n:
        end, longest = start + 1, lengths[start]
        while end < n and (end + 1 - start) * max(longest, lengths[end]) <= budget:
            longest = max(longest, lengths[end])
            end += 1
        out.append(range(start, end))
        start = end
    return out


def _sorted_by_tokens(model: Any, texts: Sequence[str]) -> tuple[list[str], list[int]]:
    """``texts`` sorted by the tokens the model sees, and those counts."""
    pairs = sorted(((model.count_tokens(t), t) for t in texts), key=lambda p: p[0])
    return [t for _, t in pairs], [n for n, _ in pairs]


def _run(model: Any, texts: Sequence[str], lengths: Sequence[int], budget: int) -> dict[str, Any]:
    """Tokenize and forward ``texts`` in :func:`token_batches` of ``budget``."""
    tokenize_s = forward_s = 0.0
    real = padded = 0
    batches = token_batches(lengths, budget)
    start = time.perf_counter()
    for rows in batches:
        t0 = time.perf_counter()
        enc = model.tokenize([texts[i] for i in rows])
        t1 = time.perf_counter()
        model.forward(enc)
        t2 = time.perf_counter()
        tokenize_s += t1 - t0
        forward_s += t2 - t1
        real += enc.n_tokens
        padded += enc.padded_tokens
    wall = time.perf_counter() - start
    n = len(batches)
    return {
        "throughput": len(texts) / wall if wall else 0.0,
        "elapsed_s": wall,
        "batches": float(n),
        "mean_batch_size": len(texts) / n if n else 0.0,
        "mean_batch_tokens": padded / n if n else 0.0,
        "padding_ratio": 1 - real / padded if padded else 0.0,
        "tokenize_share": tokenize_s / (tokenize_s + forward_s) if forward_s else 0.0,
    }


def run_raw(
    model_settings: ModelSettings,
    texts: Sequence[str],
    *,
    budgets: Sequence[int],
    sweep_n: int = 256,
) -> dict[str, Any]:
    """The model alone (see the module): every budget of ``budgets`` on the first
    ``sweep_n`` texts, then the whole of ``texts`` at the best one. ``single`` is
    the same sample one text per batch (what batching buys); ``best_batch_size``
    the mean batch at the best budget."""
    import torch

    from pipeline.inference import load_model
    from pipeline.inference.loading import resolve_dtype

    settings = dataclasses.replace(model_settings, process="off")
    model: Any = load_model(settings)
    try:
        model.predict(["warm-up"])
        ordered, lengths = _sorted_by_tokens(model, texts)
        sample, sample_lengths = _sorted_by_tokens(model, texts[:sweep_n])
        _run(model, sample, sample_lengths, max(budgets))  # warm every shape once
        sweep = {b: _run(model, sample, sample_lengths, b)["throughput"] for b in budgets}
        best = max(sweep, key=lambda b: sweep[b])
        step = max(1, len(sample) // 64)  # 64 texts across the sample's lengths, one by one
        single = _run(model, sample[::step], sample_lengths[::step], 0)["throughput"]
        result = _run(model, ordered, lengths, best)
    finally:
        device = getattr(model, "sim_device", None)
        if device is not None:
            device.close()
    if settings.device == "sim":
        dtype = f"sim-{settings.sim_profile}"
    else:
        dtype = str(resolve_dtype(settings, torch.device(str(model.device))))
    return result | {
        "best_budget": best,
        "best_batch_size": result["mean_batch_size"],
        "sweep": {str(b): v for b, v in sweep.items()},
        "single": single,
        "device": "sim" if settings.device == "sim" else str(model.device),
        "dtype": dtype.removeprefix("torch."),
        "sorted": "whole workload, by tokens",
        "sent": len(texts),
        "answered": len(texts),
    }


def run_st(
    model_settings: ModelSettings,
    texts: Sequence[str],
    *,
    sizes: Sequence[int],
    sweep_n: int = 256,
) -> dict[str, Any]:
    """sentence-transformers' ``encode`` on ``texts`` (see the module): every batch
    size of ``sizes`` on the first ``sweep_n`` texts, then all of them at the best.
    The model folder, device and dtype are ``model_settings``' (as ``raw`` loads them)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    from pipeline.inference.loading import check_model_settings, resolve_dtype

    device_name, folder, _hint = check_model_settings(model_settings)
    device = torch.device(device_name)
    dtype = resolve_dtype(model_settings, device)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    st = SentenceTransformer(
        str(folder), device=str(device), local_files_only=True, model_kwargs={"dtype": dtype}
    )

    def encode(batch: Sequence[str], size: int) -> float:
        t0 = time.perf_counter()
        st.encode(list(batch), batch_size=size, show_progress_bar=False)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    sample = list(texts[:sweep_n])
    encode(sample, max(sizes))  # warm-up
    sweep = {size: len(sample) / encode(sample, size) for size in sizes}
    best = max(sweep, key=lambda s: sweep[s])
    wall = encode(texts, best)
    return {
        "throughput": len(texts) / wall if wall else 0.0,
        "elapsed_s": wall,
        "best_batch_size": best,
        "mean_batch_size": len(texts) / math.ceil(len(texts) / best) if texts else 0.0,
        "sweep": {str(s): v for s, v in sweep.items()},
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "sent": len(texts),
        "answered": len(texts),
    }
