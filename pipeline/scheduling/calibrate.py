"""Start-up calibration: measure a few batch shapes before the first real request.

The scheduler plans every batch with its latency model (``overhead + cost x
padded tokens``). Learned only from traffic, that model starts from a prior
and, while every batch has about one size, cannot separate the two terms: a
worker that warmed up on single requests once predicted 8 ms for a batch that
took 219 ms, formed the next batch behind it and let a burst's realtime
requests expire. Running a few shapes at start-up, each twice (the first run of
a shape pays for kernel selection and allocation), gives the model batches of
different sizes to fit before it has to decide anything, and warms those
shapes up for real requests.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from pipeline.inference.outcome import BatchOutcome
from pipeline.scheduling import Controller
from pipeline.scheduling.budget import Shapes
from pipeline.scheduling.tokens import estimate_tokens

__all__ = ["SHAPES", "calibrate", "sample_text"]

log = logging.getLogger(__name__)

#: (rows, tokens per text) of the calibration batches: short texts at four batch
#: sizes, and a few long ones (so sequence length varies too).
SHAPES: tuple[tuple[int, int], ...] = ((1, 24), (4, 24), (8, 24), (16, 24), (2, 100), (4, 100))

_WORDS = ("the", "quarterly", "report", "shows", "that", "customer", "orders", "rose", "in",
          "every", "northern", "region")  # fmt: skip


class _Runs(Protocol):
    async def run(
        self, texts: list[str], *, pad_to: int | None = None, rows: int | None = None
    ) -> BatchOutcome: ...


def sample_text(tokens: int, n: int = 0) -> str:
    """A plain English text of at most ``tokens`` tokens by the worker's estimate
    (:func:`~.tokens.estimate_tokens`), and within a word of it; ``n`` makes it
    unique. Never over: with fine buckets a word more is the next bucket."""
    text, i = f"calibration {n}:", 1
    while True:
        longer = f"{text} {_WORDS[i % len(_WORDS)]}"
        if estimate_tokens(longer, tokens + 1) > tokens:
            return text
        text, i = longer, i + 1


async def calibrate(
    engine: _Runs,
    controller: Controller,
    shapes: Shapes,
    *,
    plan: Sequence[tuple[int, int]] = SHAPES,
) -> list[tuple[int, float]]:
    """Run each shape of ``plan`` twice and feed the second run's model time to the
    controller's latency model; returns ``(padded tokens, ms)`` per shape.

    The budget does not move: only the latency model learns. Padded tokens are
    counted as the scheduler counts them (rows x the sequence bucket)."""
    measured = []
    for rows, tokens in plan:
        texts = [sample_text(tokens, i) for i in range(rows)]
        seq_len = shapes.seq_len(shapes.seq_index(tokens))
        outcome = None
        for _ in range(2):
            outcome = await engine.run(texts, pad_to=seq_len, rows=shapes.batch_shape(rows))
        assert outcome is not None
        padded = rows * seq_len
        controller.model.observe(padded, outcome.inference_ms)
        measured.append((padded, outcome.inference_ms))
    model = controller.model
    log.info(
        "latency model calibrated on %d batch shapes: %.1f ms + %.3f ms per padded token "
        "(%d tokens: %.0f ms predicted)",
        len(measured),
        model.overhead_ms,
        model.ms_per_token,
        controller.budget,
        model.predict_ms(controller.budget),
    )
    return measured
