"""Inference stage: model loading, the engine threads, device telemetry.

Free of Kafka and Faust. ``load_model`` builds a :class:`Model`;
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
from pipeline.inference.model import (
    TASKS,
    Encoded,
    ForwardTiming,
    Model,
    NoopModel,
    Prediction,
)
from pipeline.inference.telemetry import (
    DeviceSample,
    DeviceTelemetry,
    SimTelemetry,
    device_utilisation,
    telemetry_for,
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
    "Model",
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
