"""What the worker tells the batch-size controller, and how large its batches may be,
on a CPU and on a GPU: the controller grows the budget on NVML's utilisation on a GPU
(the inference thread there is busy launching kernels while the GPU idles) and on the
inference thread's busy fraction on a CPU; ``max_items`` 0 means 32 rows on a CPU and
256 on a GPU.

The runtime is the real one; the model a stand-in (no GPU here); NVML a number.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support.runtime import InstantBroker, LengthEngine, settle, submit

from pipeline.client import request_bytes
from pipeline.inference import DeviceSample, device_utilisation
from pipeline.settings import SchedulerSettings, Settings
from pipeline.worker import Incoming, Origin, Runtime


class _GpuLengthEngine(LengthEngine):
    """LengthEngine on a "GPU": batches of a GPU's size; its thread always busy."""

    on_gpu = True

    def busy_fraction(self) -> float:
        return 0.8  # launching kernels and copying, as measured on an H200


@pytest.mark.parametrize(
    ("engine", "utilisation", "seen", "largest"),
    [
        (LengthEngine, None, 0.0, 32),  # a CPU: the busy fraction, 32 rows at most
        (_GpuLengthEngine, 0.03, 0.03, 256),  # a GPU: NVML's reading, 256 rows at most
    ],
)
def test_the_controller_sees_the_devices_utilisation_and_batches_fit_the_device(
    engine: type[LengthEngine], utilisation: float | None, seen: float, largest: int
) -> None:
    """Each batch's utilisation reaches the controller from ``utilisation`` when the
    worker gives one (NVML on a GPU), else from the engine's busy fraction; and a
    batch holds up to 32 requests on a CPU and 256 on a GPU (``max_items`` 0: auto)."""

    async def main() -> tuple[Runtime, LengthEngine]:
        broker, model = InstantBroker(), engine()
        released: list[int] = []

        async def release(token: Any) -> None:
            released.append(token)

        runtime = Runtime(
            Settings.from_env({"PIPELINE_SCHEDULER_TOKEN_BUDGET": "16384",
                               "PIPELINE_SCHEDULER_WINDOW_MS": "1000"}),
            engine=model,  # type: ignore[arg-type]
            publisher=broker.publisher(),
            ack=release,
            utilisation=(lambda: utilisation) if utilisation is not None else None,
        )  # fmt: skip
        for offset in range(300):  # queued before the loop runs: one full batch first
            _rid, value = request_bytes(f"text {offset}", request_id=f"r-{offset}")
            origin = Origin("lane.bulk", 0, offset, 0, None, value)
            assert await submit(runtime, Incoming("bulk", origin, token=offset))
        batches = asyncio.ensure_future(runtime.run())
        await settle(runtime, batches, lambda: len(released) == 300)
        return runtime, model

    runtime, model = asyncio.run(main())
    assert runtime.controller.last_utilisation == seen
    assert runtime.scheduler.max_items == largest
    assert max(len(b) for b in model.batches) == largest


def test_nvml_is_read_when_it_answers_and_the_busy_fraction_otherwise() -> None:
    class Nvml:
        def __init__(self, pct: float | None) -> None:
            self.pct = pct

        def sample(self) -> DeviceSample | None:
            return None if self.pct is None else DeviceSample(self.pct, 1, 2)

    def busy() -> float:
        return 0.8

    assert device_utilisation(Nvml(3.0), busy)() == 0.03  # type: ignore[arg-type]
    assert device_utilisation(Nvml(None), busy)() == 0.8  # type: ignore[arg-type]
    assert device_utilisation(None, busy)() == 0.8


def test_max_items_is_the_settings_own_unless_auto() -> None:
    assert SchedulerSettings().items_cap(on_gpu=False) == 32
    assert SchedulerSettings().items_cap(on_gpu=True) == 256
    assert SchedulerSettings(max_items=8).items_cap(on_gpu=True) == 8
