"""Reading a model's answers in tests."""

from __future__ import annotations

import struct

from pipeline.inference import Prediction


def floats(prediction: Prediction) -> list[float]:
    """The prediction's embedding as Python floats; ValueError if it has none."""
    if prediction.embedding is None:
        raise ValueError("this prediction has no embedding")
    if isinstance(prediction.embedding, list):
        return prediction.embedding
    return list(struct.unpack(f"<{len(prediction.embedding) // 4}f", prediction.embedding))
