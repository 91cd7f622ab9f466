"""Inference stage: model loading, the engine threads, device telemetry.

Free of Kafka and Faust, and of torch until a model is loaded in this process:
what this package exports imports none of it, so a worker whose model runs in a
process of its own (:mod:`.process`) never pays for torch's ~0.5 GB. The
network's side lives in :mod:`.model` (``Model``), :mod:`.sim`, :mod:`.tracing`
and :mod:`.threads`, imported where a model is built. ``load_model`` builds a model;
:class:`InferenceEngine` runs it on its own threads (the next batch is
tokenised while one computes) and returns one :class:`Outcome` per input;
:class:`DeviceTelemetry` reads the GPU (:class:`SimTelemetry` the simulated device of
:mod:`.sim`). With ``process`` on, the tokenizer and network run in a child process
(:mod:`.process`), and the engine's threads only wait for it.
"""

from pipeline.inference.engine import (
    BatchOutcome,
    EngineStats,
    EngineStopped,
    InferenceEngine,
    Outcome,
    Predictor,
)
from pipeline.inference.loading import default_model_path, load_model
from pipeline.inference.telemetry import (
    DeviceSample,
    DeviceTelemetry,
    SimTelemetry,
    device_utilisation,
    telemetry_for,
)
from pipeline.inference.types import (
    TASKS,
    Encoded,
    ForwardTiming,
    NoopModel,
    Prediction,
)

__all__ = [
    "TASKS",
    "BatchOutcome",
    "DeviceSample",
    "DeviceTelemetry",
    "Encoded",
    "EngineStats",
    "EngineStopped",
    "ForwardTiming",
    "InferenceEngine",
    "NoopModel",
    "Outcome",
    "Prediction",
    "Predictor",
    "SimTelemetry",
    "default_model_path",
    "device_utilisation",
    "load_model",
    "telemetry_for",
]
