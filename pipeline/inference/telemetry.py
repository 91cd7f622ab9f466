"""GPU utilisation and memory through NVML, for the batch-size controller.

:class:`DeviceTelemetry` never raises: on a CPU device, without NVML, or when
any NVML call fails, :meth:`DeviceTelemetry.sample` returns ``None``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "DeviceSample",
    "DeviceTelemetry",
    "SimTelemetry",
    "device_utilisation",
    "telemetry_for",
]


@dataclasses.dataclass(frozen=True)
class DeviceSample:
    """One reading of a GPU."""

    utilization_pct: float
    memory_used_bytes: int
    memory_total_bytes: int


def cuda_uuid(index: int) -> str | None:
    """The NVML-style UUID of torch's CUDA device ``index``, or None. Asked where torch
    runs the model (the model process sends it to the worker)."""
    try:  # torch's index follows CUDA_VISIBLE_DEVICES, NVML's does not: match by UUID
        import torch

        raw = str(torch.cuda.get_device_properties(index).uuid)
        return raw if raw.startswith("GPU-") else f"GPU-{raw}"
    except Exception:
        return None


def _cuda_target(device: object, uuid: str | None) -> tuple[int, str | None] | None:
    """(torch index, NVML-style UUID or None) of a CUDA device; None for anything else.
    Without ``uuid``, torch is asked only where it is imported already."""
    import sys

    text = str(device)
    if not text.startswith("cuda"):
        return None
    index = int(text.split(":", 1)[1]) if ":" in text else 0
    if uuid is None and "torch" in sys.modules:
        uuid = cuda_uuid(index)
    return index, uuid


class DeviceTelemetry:
    """Reads utilisation and memory of the GPU behind ``device`` (e.g. ``"cuda:0"``;
    ``uuid``, its NVML UUID where known)."""

    def __init__(self, device: object, uuid: str | None = None) -> None:
        self._lock = threading.Lock()
        self._nvml: Any = None
        self._handle: Any = None
        target = _cuda_target(device, uuid)
        if target is None:
            return
        index, uuid = target
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:
            return
        self._nvml = pynvml
        handle = None
        if uuid is not None:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            except Exception:
                handle = None
        if handle is None:
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except Exception:
                handle = None
        self._handle = handle

    @property
    def available(self) -> bool:
        """Whether readings can be taken at all."""
        return self._handle is not None

    def sample(self) -> DeviceSample | None:
        """The current reading, or None on CPU or when NVML cannot answer."""
        with self._lock:
            if self._handle is None:
                return None
            try:
                util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
                mem = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
                return DeviceSample(float(util.gpu), int(mem.used), int(mem.total))
            except Exception:
                return None

    def utilisation(self) -> float | None:
        """The GPU's utilisation alone (0..1), or None on CPU or when NVML cannot answer:
        one NVML call, for callers that ask after every batch and need no memory."""
        with self._lock:
            if self._handle is None:
                return None
            try:
                return float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu) / 100
            except Exception:
                return None

    def close(self) -> None:
        """Release NVML; later samples return None. Idempotent."""
        with self._lock:
            if self._nvml is not None:
                with contextlib.suppress(Exception):
                    self._nvml.nvmlShutdown()
            self._nvml = None
            self._handle = None


class SimTelemetry:
    """The simulated device's own busy counter read as a GPU's utilisation
    (:class:`~pipeline.inference.sim.SimDevice`); no memory readings."""

    def __init__(self, path: Path) -> None:
        from pipeline.inference.sim_device import SimDevice

        self._device: Any = SimDevice(path)
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        return self._device is not None

    def utilisation(self) -> float | None:
        with self._lock:
            return None if self._device is None else float(self._device.utilisation())

    def sample(self) -> DeviceSample | None:
        util = self.utilisation()
        return None if util is None else DeviceSample(util * 100, 0, 0)

    def close(self) -> None:
        with self._lock:
            if self._device is not None:
                self._device.close()
            self._device = None


def telemetry_for(model: Any, sim_path: Path) -> DeviceTelemetry | SimTelemetry:
    """The telemetry of ``model``'s device: the simulated device's counter for
    ``device=sim``, NVML for a GPU (none on a CPU: readings are None)."""
    if getattr(model, "kind", "") == "sim":
        return SimTelemetry(sim_path)
    return DeviceTelemetry(model.device, getattr(model, "device_uuid", None))


def device_utilisation(
    telemetry: DeviceTelemetry | SimTelemetry | None, busy: Callable[[], float]
) -> Callable[[], float]:
    """The utilisation (0..1) the batch-size controller grows the budget on: NVML's
    reading of the GPU when ``telemetry`` can take one, else ``busy`` (the inference
    thread's busy fraction).

    On a GPU the two differ by an order of magnitude: the inference thread is busy
    launching kernels and copying while the GPU idles (measured on an H200: busy 0.8,
    GPU 0.03, with 13-row batches), so the busy fraction kept the budget at its start
    and the batches small."""

    def read() -> float:
        reading = telemetry.utilisation() if telemetry is not None else None
        return reading if reading is not None else busy()

    return read
