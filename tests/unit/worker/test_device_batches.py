"""What the worker tells the batch-size controller on a CPU and on a GPU: it grows the
budget on NVML's utilisation on a GPU (the inference thread there is busy launching
kernels while the GPU idles) and on the inference thread's busy fraction on a CPU.

The runtime is the real one; the model a stand-in (no GPU here); NVML a number.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support.runtime import InstantBroker, LengthEngine, settle, submit

from pipeline.inference import device_utilisation
from pipeline.kafka.client import request_bytes
from pipeline.settings import Settings
from pipeline.settings.scheduling import ACCELERATOR_MAX_ITEMS, CPU_MAX_ITEMS
from pipeline.worker.records import Incoming, Origin
from pipeline.worker.runtime import Runtime


class _GpuLengthEngine(LengthEngine):
    """LengthEngine on a "GPU": its thread always busy."""

    def busy_fraction(self) -> float:
        return 0.8  # launching kernels and copying, as measured on an H200


@pytest.mark.parametrize(
    ("engine", "utilisation", "seen"),
    [
        (LengthEngine, None, 0.0),  # a CPU: the engine's busy fraction
        (_GpuLengthEngine, 0.03, 0.03),  # a GPU: NVML's reading, not the busy 0.8
    ],
)
def test_the_controller_sees_the_devices_utilisation(
    engine: type[LengthEngine], utilisation: float | None, seen: float
) -> None:
    """Each batch's utilisation reaches the controller from ``utilisation`` when the
    worker gives one (NVML on a GPU), else from the engine's busy fraction."""

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
    # PIPELINE_SCHEDULER_MAX_ITEMS=0 (auto): both stand-ins overlap batches as a GPU
    # does, so they get an accelerator's rows, past a CPU's.
    largest = max(len(b) for b in model.batches)
    assert CPU_MAX_ITEMS < largest <= ACCELERATOR_MAX_ITEMS


def test_nvml_is_read_when_it_answers_and_the_busy_fraction_otherwise() -> None:
    class Nvml:
        def __init__(self, pct: float | None) -> None:
            self.pct = pct

        def utilisation(self) -> float | None:
            return None if self.pct is None else self.pct / 100

    def busy() -> float:
        return 0.8

    assert device_utilisation(Nvml(3.0), busy)() == 0.03  # type: ignore[arg-type]
    assert device_utilisation(Nvml(None), busy)() == 0.8  # type: ignore[arg-type]
    assert device_utilisation(None, busy)() == 0.8
