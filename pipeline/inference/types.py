"""What crosses between the worker and the model, free of torch: the worker's
event loop and Kafka clients run in a process that never imports it (the model
runs in its own, :mod:`.process`).

- :class:`Prediction`: one text's answer (an embedding as float32 bytes, or a
  label and its score);
- :class:`Encoded`: a tokenised batch (the tensors where the model runs; in the
  worker, a handle on the batch the model process prepared);
- :class:`ForwardTiming`: what forwards cost on the model's side;
- :class:`NoopModel`: the ``noop`` task, no model at all.
"""

from __future__ import annotations

import dataclasses
import struct
import threading
from collections.abc import Callable
from typing import Any

from pipeline.codecs.keys import InputKeys
from pipeline.settings.tasks import TASKS

__all__ = [
    "NOOP_EMBEDDING",
    "TASKS",
    "Encoded",
    "ForwardTiming",
    "NoopModel",
    "Prediction",
]

#: What the ``noop`` task answers for every text (unit length, like a real embedding).
NOOP_EMBEDDING: tuple[float, ...] = (1.0, 0.0, 0.0, 0.0)
_NOOP_BYTES = struct.pack("<4f", *NOOP_EMBEDDING)


@dataclasses.dataclass(frozen=True)
class Prediction:
    """What the model says about one text: an embedding, or a label and its score.

    A model's ``embedding`` is the vector as float32 little-endian bytes (Avro's
    float is the same 4 bytes), so it reaches the result's encoder without ever
    becoming Python floats; a list of floats is accepted too (test stand-ins).
    """

    embedding: bytes | list[float] | None = None
    label: str | None = None
    score: float | None = None


class ForwardTiming:
    """What forwards cost on the model's side, summed: wall seconds, and the seconds
    spent waiting for the interpreter lock where the model can tell (the simulated
    device; ``None`` otherwise). Thread-safe; read with :meth:`totals`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._forward_s = 0.0
        self._lock_wait_s: float | None = None
        self._calls = 0

    def add(self, forward_s: float, lock_wait_s: float | None) -> None:
        with self._lock:
            self._forward_s += forward_s
            self._calls += 1
            if lock_wait_s is not None:
                self._lock_wait_s = (self._lock_wait_s or 0.0) + lock_wait_s

    def totals(self) -> tuple[int, float, float | None]:
        """(forwards, their wall seconds, lock-wait seconds or None) so far."""
        with self._lock:
            return self._calls, self._forward_s, self._lock_wait_s


@dataclasses.dataclass(frozen=True)
class Encoded:
    """A tokenised batch: model-ready tensors plus the texts they came from.

    ``n_tokens`` counts real tokens (special tokens included, after
    truncation); ``padded_tokens`` is rows × padded length, the work the
    model actually does (rows may exceed ``len(texts)``: padding rows). On
    CUDA the tensors are already on the device, copied on a side stream that
    ``ready`` (a CUDA event) marks done; ``None`` elsewhere.
    """

    texts: list[str]
    tensors: dict[str, Any]  # torch tensors where the model runs
    n_tokens: int
    padded_tokens: int
    ready: Any = None
    handle: int | None = None  # a batch prepared in the model process (process.py)

    @property
    def padding_ratio(self) -> float:
        """Share of the computed positions that are padding, in [0, 1)."""
        if self.padded_tokens == 0:
            return 0.0
        return 1.0 - self.n_tokens / self.padded_tokens


class NoopModel:
    """A model that does no work: no weights, no tokenizer, no torch call.

    Tokens are counted as words + 2 (special tokens), capped at ``max_length``,
    so the pipeline's token accounting still sees plausible numbers.
    """

    def __init__(
        self,
        *,
        name: str,
        version: str,
        max_length: int,
        keys: Callable[[str], str] | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.task = "noop"
        self.device = "cpu"
        self.kind = "cpu"
        self.accelerated = False
        self.timing = ForwardTiming()
        self.max_length = max_length
        self.keys: Callable[[str], str] = keys or InputKeys(self.model_id)

    @property
    def model_id(self) -> str:
        return f"{self.name}@{self.version}"

    def __repr__(self) -> str:
        return f"NoopModel({self.model_id!r})"

    def count_tokens(self, text: str) -> int:
        return min(len(text.split()) + 2, self.max_length)

    def tokenize(
        self, texts: list[str], *, pad_to: int | None = None, rows: int | None = None
    ) -> Encoded:
        del pad_to, rows  # nothing to pad
        counts = [self.count_tokens(t) for t in texts]
        return Encoded(
            texts=list(texts),
            tensors={},
            n_tokens=sum(counts),
            padded_tokens=len(counts) * max(counts, default=0),
        )

    def forward(self, enc: Encoded) -> list[Prediction]:
        return [Prediction(embedding=_NOOP_BYTES) for _ in enc.texts]

    def predict(self, texts: list[str]) -> list[Prediction]:
        return self.forward(self.tokenize(texts))
