"""Run the network as a TorchScript trace, so a busy event loop cannot stall a batch.

An eager Hugging Face module is a few hundred small torch calls made from
Python; each releases the GIL while it computes and must take it back before
the next one. When the event loop's thread is busy in Python (a burst of
intake), every take-back waits up to the interpreter's switch interval
(5 ms): measured here, a batch of 8 short texts with one torch thread took
25 ms alone and 560 ms next to a thread spinning in Python. A trace runs the
whole graph in C++ with the GIL released: 23 ms alone, 28 ms next to the
same spinning thread.

:func:`traced` traces with a padded two-text sample (so the mask is not
constant-folded away), then checks the trace against the eager module on a
batch of another shape; any failure or difference leaves the module eager
(the caller logs why). :class:`TracedNetwork` calls it like the eager module:
keyword tensors in, attribute access to ``last_hidden_state`` / ``logits``.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

import torch

__all__ = ["TracedNetwork", "traced"]

#: Largest absolute difference between eager and traced outputs accepted.
TOLERANCE = 1e-4

_SAMPLE = ("a short text", "a somewhat longer text, so that the first one is padded")
_CHECK = (
    "one",
    "a third text of another length entirely, to check a shape the trace did not see "
    "when it was made: more rows and more columns than the sample had",
    "and a middle one",
)


class TracedNetwork:
    """The traced graph, called like the eager module it came from."""

    def __init__(self, graph: Any, config: Any, input_names: tuple[str, ...]) -> None:
        self.graph = graph
        self.config = config
        self.input_names = input_names

    def __call__(self, **inputs: torch.Tensor) -> SimpleNamespace:
        out = self.graph(**{name: inputs[name] for name in self.input_names})
        if isinstance(out, dict):
            return SimpleNamespace(**out)
        return SimpleNamespace(last_hidden_state=out[0], logits=out[0])


def traced(
    network: torch.nn.Module, tokenizer: Any, device: torch.device, *, output: str
) -> TracedNetwork:
    """Trace ``network`` (in eval mode, on ``device``); ``output`` names the tensor
    the task reads (``last_hidden_state`` or ``logits``). Raises ``RuntimeError``
    when the trace fails, cannot be checked, or its output differs from the eager
    module's (the caller then keeps the eager module)."""

    def encode(texts: tuple[str, ...]) -> dict[str, torch.Tensor]:
        enc = tokenizer(list(texts), padding=True, truncation=True, return_tensors="pt")
        return {k: v.to(device) for k, v in enc.items()}

    sample = encode(_SAMPLE)
    names = tuple(sample)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TracerWarnings about Python control flow
            graph = torch.jit.trace(  # type: ignore[no-untyped-call]
                network, example_kwarg_inputs=sample, strict=False, check_trace=False
            )
    except Exception as exc:  # torch raises many kinds here
        raise RuntimeError(f"tracing failed: {type(exc).__name__}: {exc}") from exc
    result = TracedNetwork(graph, getattr(network, "config", None), names)
    check = encode(_CHECK)
    try:
        with torch.inference_mode():
            want = network(**check)[output]  # a ModelOutput is a dict too
            got = getattr(result(**check), output)
    except Exception as exc:  # an output without ``output``, a graph that cannot run
        raise RuntimeError(f"checking the trace failed: {type(exc).__name__}: {exc}") from exc
    if want.shape != got.shape:
        shapes = f"{tuple(got.shape)}, not {tuple(want.shape)}"
        raise RuntimeError(f"the trace's output has shape {shapes}")
    if output == "last_hidden_state":  # padded positions are masked out by pooling
        mask = check["attention_mask"].unsqueeze(-1).to(want.dtype)
        want, got = want * mask, got * mask
    diff = float((want.float() - got.float()).abs().max())
    if diff > TOLERANCE:
        raise RuntimeError(f"the trace differs from the eager module by {diff:.2e}")
    return result
