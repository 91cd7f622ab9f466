"""Run a loaded Hugging Face model: embed or classify.

:func:`~.loading.load_model` builds the model (:mod:`.loading`). A
:class:`Model` runs ``forward`` on one thread at a time (the engine's
inference thread); ``tokenize`` may run meanwhile on another (the
engine's tokenizer stage): tokenizer calls are serialised by a lock, since the
fast tokenizer changes its padding state on every call. A batch is encoded by
:class:`~.batch_tokenizer.BatchTokenizer` (the Rust backend, about twice as fast)
wherever it gave transformers' own tensors at load.

Tasks:

- ``embed``: attention-mask mean pooling of the last hidden state, then L2
  normalisation; the same vectors sentence-transformers gives for
  all-MiniLM-L6-v2.
- ``classify``: softmax over the logits; the label comes from the model's
  ``config.id2label`` and the score is the top probability.
- ``noop``: no model at all (:class:`NoopModel`): a fixed tiny embedding per
  text, so a worker measures the pipeline's own cost per event.

Padding (``settings.padding``): a batch is padded to its longest text, or up
to the scheduler's sequence bucket (``pad_to``; never shorter than the
longest text, so nothing is truncated to it) and, with ``shape``, with empty
rows up to the batch-size bucket (``rows``): on a GPU a few recurring shapes
let the caching allocator reuse its blocks; on a CPU padding only costs work.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pipeline.codecs.keys import InputKeys
from pipeline.errors import InferenceError
from pipeline.inference.batch_tokenizer import BatchTokenizer
from pipeline.inference.types import (
    NOOP_EMBEDDING,
    TASKS,
    Encoded,
    ForwardTiming,
    NoopModel,
    Prediction,
)
from pipeline.settings.tasks import task_of

__all__ = [
    "NOOP_EMBEDDING",
    "TASKS",
    "Encoded",
    "ForwardTiming",
    "Model",
    "NoopModel",
    "Prediction",
]


class Model:
    """A loaded model, its tokenizer and its task. Build it with :func:`~.loading.load_model`."""

    def __init__(
        self,
        *,
        name: str,
        version: str,
        task: str,
        device: torch.device,
        tokenizer: Any,
        network: Any,  # the eager module, or its TracedNetwork
        max_length: int,
        fail_on: str = "",
        padding: str = "longest",
        keys: Callable[[str], str] | None = None,
        fingerprint: str = "",
    ) -> None:
        self.name = name
        #: What the dedupe keys cover (:func:`~.fingerprint.model_fingerprint`).
        self.fingerprint = fingerprint
        self.version = version
        self.task = task
        #: Whether answers are embeddings (else a label and its score): the task's own say.
        self._embeds = task_of(task).embeds
        self.device = device
        self.timing = ForwardTiming()
        self.max_length = max_length
        self._tokenizer = tokenizer
        self._tokenizer_lock = threading.Lock()
        #: The model's Python side, one thread at a time: a forward's launch sequence
        #: (a few hundred torch calls, each dropping and re-taking the interpreter
        #: lock) never interleaves with the Python part of preparing the next batch,
        #: so neither waits for the interpreter lock at each of the other's calls.
        #: The tokenizer's Rust work and the device's own time stay outside it.
        self.launch_lock = threading.Lock()
        self._batch_tokenizer = BatchTokenizer.of(tokenizer, max_length)
        self._network = network
        self._fail_on = re.compile(fail_on) if fail_on else None
        if padding == "auto":
            padding = "bucket" if device.type == "cuda" else "longest"
        self.padding = padding
        self._pad_id = int(getattr(tokenizer, "pad_token_id", None) or 0)
        self._pad_left = getattr(tokenizer, "padding_side", "right") == "left"
        self._copy_stream: Any = None
        if device.type == "cuda":
            self._copy_stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        id2label = getattr(getattr(network, "config", None), "id2label", None) or {}
        self._labels: dict[int, str] = {int(k): str(v) for k, v in id2label.items()}
        #: Dedupe key of a text (:class:`~pipeline.codecs.keys.InputKeys`; ``load_model`` sets
        #: one over the model's fingerprint and tokenizer; the default keys texts exactly).
        self.keys: Callable[[str], str] = keys or InputKeys(self.model_id)

    @property
    def model_id(self) -> str:
        """``name@version``: what content hashes and stored results are keyed on."""
        return f"{self.name}@{self.version}"

    def __repr__(self) -> str:
        return f"Model({self.model_id!r}, task={self.task!r}, device={str(self.device)!r})"

    @property
    def kind(self) -> str:
        """What computes: ``cpu``, ``cuda`` (or ``sim``, :class:`~.sim.SimModel`)."""
        return str(self.device.type)

    @property
    def accelerated(self) -> bool:
        """Whether an accelerator computes (CUDA, or the simulated device): it works
        while the host prepares the next batch, and wants big batches."""
        return self.kind in ("cuda", "sim")

    def count_tokens(self, text: str) -> int:
        """Tokens the model will see for ``text``: special tokens included, truncated."""
        with self._tokenizer_lock:
            ids = self._tokenizer(text, truncation=True, max_length=self.max_length)["input_ids"]
        return len(ids)

    def tokenize(
        self, texts: list[str], *, pad_to: int | None = None, rows: int | None = None
    ) -> Encoded:
        """Encode a batch, truncated at ``max_length``, padded as ``self.padding`` says.

        ``pad_to`` (bucket, shape) is a least sequence length, capped at
        ``max_length``; ``rows`` (shape only) a least row count. On CUDA the
        tensors are copied to the device from pinned memory on a side stream,
        so this may run on another thread while ``forward`` computes.
        """
        fast = self._batch_tokenizer is not None and bool(texts)
        with self._tokenizer_lock:
            encodings = self._batch_tokenizer.encode(list(texts)) if fast else None  # type: ignore[union-attr]
        with self.launch_lock:
            if encodings is not None:
                tensors = self._batch_tokenizer.tensors(encodings)  # type: ignore[union-attr]
            else:
                with self._tokenizer_lock:
                    batch = self._tokenizer(
                        list(texts),
                        padding="longest",
                        truncation=True,
                        max_length=self.max_length,
                        return_tensors="pt",
                    )
                tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
            n_tokens = int(tensors["attention_mask"].sum().item())
            if self.padding != "longest":
                tensors = self._pad(tensors, pad_to, rows if self.padding == "shape" else None)
            padded = int(tensors["attention_mask"].numel())
            ready = None
            if self._copy_stream is not None:
                with torch.cuda.stream(self._copy_stream):
                    tensors = {
                        k: v.pin_memory().to(self.device, non_blocking=True)
                        for k, v in tensors.items()
                    }
                ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
                ready.record(self._copy_stream)
        return Encoded(list(texts), tensors, n_tokens, padded, ready)

    def _pad(
        self, tensors: dict[str, torch.Tensor], pad_to: int | None, rows: int | None
    ) -> dict[str, torch.Tensor]:
        n, width = tensors["attention_mask"].shape
        cols = max(0, min(pad_to or 0, self.max_length) - width)
        extra = max(0, (rows or 0) - n)
        if not cols and not extra:
            return tensors
        sides = (cols, 0, 0, extra) if self._pad_left else (0, cols, 0, extra)
        out = {
            k: torch.nn.functional.pad(v, sides, value=self._pad_id if k == "input_ids" else 0)
            for k, v in tensors.items()
        }
        if extra:  # a row attending to nothing can turn attention into NaN: let it see one
            out["attention_mask"][n:, -1 if self._pad_left else 0] = 1
        return out

    def forward(self, enc: Encoded) -> list[Prediction]:
        """One prediction per text of ``enc``, in order.

        Raises :class:`InferenceError` when fault injection (``fail_on``)
        matches a text of the batch; any other error comes from torch.
        """
        self._inject_faults(enc)
        t0 = time.perf_counter()
        n = len(enc.texts)  # padding rows, if any, come after the texts
        with self.launch_lock, torch.inference_mode():
            if enc.ready is not None:  # copied on the side stream: wait for it, keep the memory
                stream = torch.cuda.current_stream(self.device)
                stream.wait_event(enc.ready)
                for tensor in enc.tensors.values():
                    tensor.record_stream(stream)
            inputs = {k: v.to(self.device, non_blocking=True) for k, v in enc.tensors.items()}
            output = self._network(**inputs)
            if self._embeds:
                normed = self._pool(output.last_hidden_state[:n], inputs["attention_mask"][:n])
            else:
                top = self._top(output.logits[:n])
        # The copy back, once per batch, waits for the device: outside the launch lock.
        preds = self._embeddings(normed) if self._embeds else self._labelled(top)
        assert len(preds) == len(enc.texts), "one prediction per text"
        self.timing.add(time.perf_counter() - t0, None)
        return preds

    def _inject_faults(self, enc: Encoded) -> None:
        """Raise :class:`InferenceError` when ``fail_on`` matches a text of ``enc``."""
        if self._fail_on is not None:
            for text in enc.texts:
                if self._fail_on.search(text):
                    raise InferenceError("fault injection: a text matches PIPELINE_MODEL_FAIL_ON")

    def predict(self, texts: list[str]) -> list[Prediction]:
        """``forward(tokenize(texts))``."""
        return self.forward(self.tokenize(texts))

    @staticmethod
    def _pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Mean pooling over the mask, then L2 normalisation (on the device)."""
        weights = mask.unsqueeze(-1).to(torch.float32)
        summed = (hidden.to(torch.float32) * weights).sum(dim=1)
        pooled = summed / weights.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1)

    @staticmethod
    def _top(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The top probability and its index per row (on the device)."""
        top, index = torch.softmax(logits.to(torch.float32), dim=-1).max(dim=-1)
        return top, index

    @staticmethod
    def _embeddings(normed: torch.Tensor) -> list[Prediction]:
        rows = np.ascontiguousarray(normed.cpu().numpy(), dtype="<f4")  # one copy back
        return [Prediction(embedding=row.tobytes()) for row in rows]

    def _labelled(self, head: tuple[torch.Tensor, torch.Tensor]) -> list[Prediction]:
        top, index = head
        return [
            Prediction(label=self._labels.get(i, f"LABEL_{i}"), score=s)
            for s, i in zip(top.cpu().tolist(), index.cpu().tolist(), strict=True)
        ]
