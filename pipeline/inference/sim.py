"""A simulated accelerator: what a GPU forward costs the host, on any machine.

A benchmark instrument, never a stand-in for the model in tests of results: its
embeddings are one fixed unit vector. It keeps the real tokenizer and padding
(:class:`SimModel` is a :class:`~.model.Model` whose network is replaced) and
costs the host what a CUDA forward does, in three phases (docs/design.md,
"The simulated device", says how the profiles were calibrated):

1. **launch**: ``launches`` calls of ``launch_us`` of Python work each (the
   interpreter lock held), every one followed by a wait that drops and re-takes
   the lock (a zero-timeout ``select``; ``time.sleep`` where ``native_us`` is
   set), as torch's bindings do around each kernel launch;
2. **device**: ``fixed_ms + per_token_ns x padded tokens`` waited without the
   lock, holding the host's one simulated device (a file lock shared by every
   process on the host; the time is added to a busy counter in the same file);
3. **readback**: rows x ``dim`` float32 copied out, once per batch.

Promise: :attr:`SimModel.timing` counts, per forward, the wall time and the
time its launches spent taking the interpreter lock back: each release's
duration beyond the least a release took at construction (a bare one). A
wait for the lock inside the Python work itself is not counted (the spin is
timed by the clock, so a thread that loses the lock mid-spin ends it early):
the figure is a floor, close to the whole when the work is short.
"""

from __future__ import annotations

import dataclasses
import select
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.inference.model import Encoded, Model, Prediction
from pipeline.inference.sim_device import SimDevice, read_busy_s

__all__ = ["PROFILES", "SimDevice", "SimModel", "SimProfile", "read_busy_s"]


@dataclasses.dataclass(frozen=True)
class SimProfile:
    """What one forward costs the host (see the module's phases)."""

    name: str
    launches: int
    launch_us: float
    native_us: float  # per launch, waited without the lock (0: sleep(0), a bare round trip)
    fixed_ms: float
    per_token_ns: float
    dim: int = 384


#: The profiles of ``PIPELINE_MODEL_SIM_PROFILE``. eager/traced/graphed share the
#: device phase of all-MiniLM-L6-v2 on an H100/H200 class card (0.3 ms a batch,
#: 90 ns a padded token: ~21 MFLOP a token at ~23 % of the dense bf16 peak); slow
#: is a device slower than the pipeline (~2,000 short texts/s), where the model
#: alone must decide the rate.
PROFILES: dict[str, SimProfile] = {
    "eager": SimProfile("eager", launches=250, launch_us=8.0, native_us=0.0,
                        fixed_ms=0.3, per_token_ns=90.0),
    "traced": SimProfile("traced", launches=1, launch_us=20.0, native_us=1000.0,
                         fixed_ms=0.3, per_token_ns=90.0),
    "graphed": SimProfile("graphed", launches=10, launch_us=10.0, native_us=0.0,
                          fixed_ms=0.3, per_token_ns=90.0),
    "slow": SimProfile("slow", launches=10, launch_us=10.0, native_us=0.0,
                       fixed_ms=2.0, per_token_ns=20000.0),
}  # fmt: skip


def _spin(seconds: float) -> None:
    """Python work for ``seconds``: the lock is held (and yielded only on request)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class SimModel(Model):
    """A :class:`Model` whose network is the simulated device (``device=sim``)."""

    def __init__(self, *, profile: SimProfile, device_file: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.profile = profile
        self.sim_device = SimDevice(device_file)
        self._rows = np.zeros((0, profile.dim), np.float32)
        # What a release costs when nobody else wants the lock: the least of a few
        # (contention only ever adds to it, so the minimum is the bare call).
        self._release_s = min(self._timed_release() for _ in range(50))

    @property
    def kind(self) -> str:
        return "sim"

    def __repr__(self) -> str:
        return f"SimModel({self.model_id!r}, task={self.task!r}, profile={self.profile.name!r})"

    def _timed_release(self) -> float:
        """Drop the lock and take it back (after ``native_us`` without it, as a kernel
        launch does); the seconds it took, re-taking the lock included."""
        t0 = time.perf_counter()
        if self.profile.native_us:
            time.sleep(self.profile.native_us / 1e6)
        else:  # a bare drop and re-take of the lock (sleep(0) would add ~70 µs of timer slack)
            select.select([], [], [], 0)
        return time.perf_counter() - t0

    def _launch(self) -> float:
        """One launch; returns the time spent waiting to take the lock back."""
        _spin(self.profile.launch_us / 1e6)
        return max(0.0, self._timed_release() - self._release_s)

    def forward(self, enc: Encoded) -> list[Prediction]:
        """One prediction per text: launch, device, readback (see the module)."""
        self._inject_faults(enc)
        p, n = self.profile, len(enc.texts)
        t0 = time.perf_counter()
        with self.launch_lock:  # as Model.forward: see Model.launch_lock
            waited = sum(self._launch() for _ in range(p.launches))
        self.sim_device.run(p.fixed_ms / 1e3 + p.per_token_ns * enc.padded_tokens / 1e9)
        if self._rows.shape[0] < n:
            self._rows = np.zeros((max(n, 2 * self._rows.shape[0]), p.dim), np.float32)
            self._rows[:, 0] = 1.0
        out = self._rows[:n].copy()  # the readback: rows x dim float32, once per batch
        if self._embeds:
            preds = [Prediction(embedding=row.tobytes()) for row in out]
        else:
            preds = [Prediction(label=self._labels.get(0, "LABEL_0"), score=1.0)] * n
        wall = time.perf_counter() - t0
        self.timing.add(wall, waited)
        return preds
