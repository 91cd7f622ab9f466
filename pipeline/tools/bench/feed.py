"""How well the pipeline feeds the device, from one run's report (pure).

- **F**: adaptive's saturated throughput without repeats (its ``dup-0`` phase)
  over min(raw, noop): the pipeline against the slower of the model alone and
  the pipeline alone. 1.0: the pipeline adds nothing to its own limit. noop's
  term is its saturation phase, as the issue defines F, whose repeats
  (``--dup-rate``, a fifth by default) the store answers without a batch.
- **F0** (context, not a target): the same over min(raw, noop's ``dup-0``), noop
  on adaptive's new texts only. It is no ceiling: noop's model is not an
  accelerator, so its batches are a CPU's (32 texts, one at a time), and with
  no repeats to answer from the store it ran below adaptive on the graphed
  profile (F0 0.82-1.07 where F was 0.78-0.87).
- **G**: of the model side's forward time over adaptive's saturated phases
  (:data:`SATURATED`), the share its thread spent waiting for the interpreter
  lock (``pipeline_model_lock_wait_seconds`` over
  ``pipeline_model_forward_seconds``); known on ``--device sim`` only.
- **U**: the device's busy share under the backlog: the simulated device's own
  counter over the phase's wall time (``sim``), NVML's mean (``cuda``).
- **Batches**: adaptive's mean batch size and padded tokens per batch under the
  backlog, against raw's at its best budget.
- **Memory**: the adaptive worker's peak RSS and its model process's, over its
  phases.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GIB", "SATURATED", "feed", "feed_lines"]

GIB = 1024**3

#: adaptive's phases that keep the worker saturated (a backlog in front of the model).
SATURATED = ("saturate", "dup-0", "dup-50", "burst", "backlog")


def _phase(report: dict[str, Any], mode: str, phase: str) -> dict[str, Any] | None:
    for p in report["modes"].get(mode, {}).get("phases", []):
        if p.get("phase") == phase:
            return dict(p)
    return None


def _get(phase: dict[str, Any] | None, key: str) -> float | None:
    value = None if phase is None else phase.get(key)
    return None if value is None else float(value)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _peak(report: dict[str, Any], mode: str, key: str) -> float | None:
    """The largest ``key`` (bytes) over ``mode``'s phases, in GiB."""
    phases = (report["modes"].get(mode) or {}).get("phases", [])
    peaks = [p[key] for p in phases if p.get(key)]
    return max(peaks) / GIB if peaks else None


def _profile(report: dict[str, Any]) -> str | None:
    """The simulated device's profile the adaptive workers ran (``--set`` wins)."""
    config = report.get("config") or {}
    if config.get("device") != "sim":
        return None
    env = (report["modes"].get("adaptive") or {}).get("env") or {}
    return str(env.get("PIPELINE_MODEL_SIM_PROFILE") or config.get("sim_profile") or "eager")


def feed(report: dict[str, Any]) -> dict[str, Any]:
    """F, G, U, the backlog's batches against raw's best, and peak memory (see the
    module); a value is ``None`` where the modes or readings it needs are missing."""
    device = (report.get("config") or {}).get("device") or "auto"
    raw = _phase(report, "raw", "saturate")
    st = _phase(report, "st", "saturate")
    unique = _get(_phase(report, "adaptive", "dup-0"), "throughput")
    raw_t = _get(raw, "throughput")
    noop_t = _get(_phase(report, "noop", "saturate"), "throughput")
    noop_unique = _get(_phase(report, "noop", "dup-0"), "throughput")
    base = None if raw_t is None or noop_t is None else min(raw_t, noop_t)
    base0 = None if raw_t is None or noop_unique is None else min(raw_t, noop_unique)
    forward = wait = 0.0
    for name in SATURATED:
        p = _phase(report, "adaptive", name)
        forward += _get(p, "model_forward_s") or 0.0
        wait += _get(p, "model_lock_wait_s") or 0.0
    backlog = _phase(report, "adaptive", "backlog")
    u = _get(backlog, {"sim": "device_busy", "cuda": "gpu_util"}.get(device, "-"))
    worker, model = (
        _peak(report, "adaptive", "peak_rss_bytes"),
        _peak(report, "adaptive", "model_peak_rss_bytes"),
    )
    return {
        "device": device,
        "sim_profile": _profile(report),
        "F": _ratio(unique, base),
        "F_base": None if base is None else ("raw" if base == raw_t else "noop"),
        "adaptive_unique": unique,
        "raw": raw_t,
        "noop": noop_t,
        "noop_unique": noop_unique,
        "F0": _ratio(unique, base0),
        "G": wait / forward if device == "sim" and forward else None,
        "model_forward_s": forward,
        "model_lock_wait_s": wait if device == "sim" else None,
        "U": u,
        "U_source": {"sim": "simulated device's counter", "cuda": "NVML"}.get(device),
        "backlog_batch": _get(backlog, "mean_batch_size"),
        "backlog_batch_tokens": _get(backlog, "mean_batch_tokens"),
        "raw_best_batch": _get(raw, "best_batch_size"),
        "raw_batch_tokens": _get(raw, "mean_batch_tokens"),
        "batch_ratio": _ratio(_get(backlog, "mean_batch_size"), _get(raw, "best_batch_size")),
        "tokens_ratio": _ratio(_get(backlog, "mean_batch_tokens"), _get(raw, "mean_batch_tokens")),
        "st": _get(st, "throughput"),
        "raw_over_st": _ratio(raw_t, _get(st, "throughput")),
        "worker_rss_gib": worker,
        "model_rss_gib": model,
        "rss_total_gib": None if worker is None else worker + (model or 0.0),
    }


def _n(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def feed_lines(report: dict[str, Any]) -> list[str]:
    """The model alone and the feed, as two Markdown paragraphs (none for a run
    with neither raw nor adaptive)."""
    f = feed(report)
    lines: list[str] = []
    raw = _phase(report, "raw", "saturate")
    if raw is not None and raw.get("best_budget") is not None:
        st = _phase(report, "st", "saturate")
        anchor = (
            "sentence-transformers' encode: n/a on the simulated device"
            if f["device"] == "sim"
            else "sentence-transformers' encode: not run"
            if st is None
            else f"sentence-transformers' encode {_n(st['throughput'])}/s at batch "
            f"{st['best_batch_size']} ({st['dtype']}); raw / encode {_n(f['raw_over_st'], 2)}x"
        )
        lines += [
            f"The model alone: raw {_n(raw['throughput'])}/s on {raw['device']} "
            f"({raw['dtype']}), the whole workload sorted by tokens and cut by a budget of "
            f"{raw['best_budget']:,} padded tokens (the best of {', '.join(raw['sweep'])}): "
            f"{_n(raw['mean_batch_size'], 1)} texts and {_n(raw['mean_batch_tokens'])} tokens a "
            f"batch, {_n(100 * raw['padding_ratio'])} % padding; {anchor}.",
            "",
        ]
    if "adaptive" in report["modes"]:
        where = f"sim, {f['sim_profile']} profile" if f["sim_profile"] else f["device"]
        base = f"min(raw {_n(f['raw'])}/s, noop {_n(f['noop'])}/s)"
        if f["F0"] is not None:
            base += (
                f" (F0 = {_n(f['F0'], 2)} over noop at 0 % repeats, {_n(f['noop_unique'])}/s:"
                " context, not a target)"
            )
        g = (
            f"G = {_n(f['G'], 2)} of the model's forward time waiting for the interpreter "
            "lock (adaptive's saturated phases)"
            if f["device"] == "sim"
            else "G: not measured off the simulated device"
        )
        u = f"U = {_n(f['U'], 2)} ({f['U_source']})" if f["U_source"] else "U: no device reading"
        lines += [
            f"Feed ({where}): F = {_n(f['F'], 2)}, adaptive at 0 % repeats "
            f"{_n(f['adaptive_unique'])}/s over {base}; {g}; {u}, the device's busy share "
            f"under the backlog. Under the backlog, batches of {_n(f['backlog_batch'], 1)} "
            f"texts and {_n(f['backlog_batch_tokens'])} tokens against raw's best "
            f"{_n(f['raw_best_batch'], 1)} and {_n(f['raw_batch_tokens'])} "
            f"({_n(f['batch_ratio'], 2)}x, {_n(f['tokens_ratio'], 2)}x). Peak RSS: worker "
            f"{_n(f['worker_rss_gib'], 2)} GiB, model process {_n(f['model_rss_gib'], 2)} GiB.",
            "",
        ]
    return lines
