"""Tokenize a batch straight from the fast tokenizer's Rust backend.

transformers' own call (``tokenizer(texts, padding="longest", truncation=True,
return_tensors="pt")``) sets the backend's truncation and padding on every call,
turns each encoding into Python lists and builds the tensors from those. The
backend's ``encode_batch`` and numpy give the same tensors in 0.4-0.6 of the
time here (16-64 texts), and on a GPU host transformers' Python side held the
GIL for a tenth of the worker's time (docs/bench-cuda).

Promise: :meth:`BatchTokenizer.of` returns a tokenizer only when it gave
transformers' tensors exactly (keys, shapes, dtypes, values) on probe batches
at load, so a model whose tokenizer behaves otherwise keeps transformers' path.
"""

from __future__ import annotations

import logging
from itertools import chain
from typing import Any

import numpy as np
import torch

__all__ = ["BatchTokenizer"]

log = logging.getLogger(__name__)

# Batches compared with transformers' call at load: empty and one-character texts,
# punctuation, accents, CJK and emoji, whitespace runs, and one past any max_length.
PROBES: tuple[tuple[str, ...], ...] = (
    ("", "a", "Hello, world!", "naïve café, 東京, 😀", "  spaced\tout \n text ", "word " * 3000),
    ("one text alone",),
    ("Hello, world!", "naïve café, 東京, 😀"),
)

# Model input name -> the attribute of a tokenizers.Encoding that holds it.
_FIELDS = (
    ("input_ids", "ids"),
    ("token_type_ids", "type_ids"),
    ("attention_mask", "attention_mask"),
)


class BatchTokenizer:
    """Encodes a batch, truncated at ``max_length`` and padded to its longest text,
    into int64 tensors of the model's input names. Not thread-safe: the model calls
    it under its tokenizer lock.

    The backend neither pads nor tracks offsets (``encode_batch_fast``): each text's
    tokens only are turned into Python lists, and numpy lays them out padded. On the
    bench's texts (190 a batch of random lengths, median 11 tokens, a long tail) the
    backend's own padding and offsets cost 38 µs a text and the lists of padded rows
    9.5 more; this, about 25 + 3 (docs/design.md, "Tokenising in the model process")."""

    def __init__(
        self, backend: Any, names: tuple[str, ...], *, pad_id: int, pad_type_id: int, left: bool
    ) -> None:
        self._encode = getattr(backend, "encode_batch_fast", None) or backend.encode_batch
        self._fields = [(name, attr) for name, attr in _FIELDS if name in names]
        self._pad = {"input_ids": pad_id, "token_type_ids": pad_type_id}
        self._left = left

    def __call__(self, texts: list[str]) -> dict[str, torch.Tensor]:
        return self.tensors(self.encode(texts))

    def encode(self, texts: list[str]) -> list[Any]:
        """The backend's encodings, unpadded (Rust; the interpreter lock is free meanwhile)."""
        return list(self._encode(texts))

    def tensors(self, encodings: list[Any]) -> dict[str, torch.Tensor]:
        """The model's int64 input tensors of ``encodings``, padded to the longest
        (Python and numpy: holds the lock)."""
        n = len(encodings)
        lengths = np.fromiter((len(e) for e in encodings), np.int64, n)
        width = int(lengths.max()) if n else 0
        cols = np.arange(width)
        # Row-major: each row's real tokens in order, at its end when padding is left.
        real = cols >= (width - lengths)[:, None] if self._left else cols < lengths[:, None]
        total = int(lengths.sum())
        out: dict[str, torch.Tensor] = {}
        for name, attr in self._fields:
            if name == "attention_mask":
                out[name] = torch.from_numpy(real.astype(np.int64))
                continue
            values = chain.from_iterable(getattr(e, attr) for e in encodings)
            array = np.full((n, width), self._pad[name], np.int64)
            array[real] = np.fromiter(values, np.int64, total)
            out[name] = torch.from_numpy(array)
        return out

    @classmethod
    def of(cls, tokenizer: Any, max_length: int) -> BatchTokenizer | None:
        """The batch tokenizer of transformers' fast ``tokenizer``, or ``None`` when it
        has no Rust backend, names inputs this does not build, or differs from
        transformers' own call on any probe batch."""
        try:
            from tokenizers import Tokenizer

            backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
            backend.enable_truncation(max_length=max_length, direction=tokenizer.truncation_side)
            backend.no_padding()
            names = tuple(tokenizer.model_input_names)
            fast = cls(
                backend,
                names,
                pad_id=int(tokenizer.pad_token_id),
                pad_type_id=int(tokenizer.pad_token_type_id),
                left=tokenizer.padding_side == "left",
            )
            for probe in PROBES:
                want = tokenizer(list(probe), padding="longest", truncation=True,
                                 max_length=max_length, return_tensors="pt")  # fmt: skip
                got = fast(list(probe))
                expected = {k: v for k, v in want.items() if isinstance(v, torch.Tensor)}
                if set(got) != set(expected) or not all(
                    got[k].dtype == expected[k].dtype and torch.equal(got[k], expected[k])
                    for k in got
                ):
                    log.info("tokenizer: transformers' path (the backend's differs on a probe)")
                    return None
        except Exception as exc:  # no backend, a slow tokenizer, an unexpected layout
            log.info("tokenizer: transformers' path (%s: %s)", type(exc).__name__, exc)
            return None
        return fast
