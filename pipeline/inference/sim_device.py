"""The host's one simulated device (``PIPELINE_MODEL_DEVICE=sim``, :mod:`.sim`): a
file whose lock serialises every process's device phase and whose first 8 bytes
count the nanoseconds it was busy. Free of torch: the worker reads the counter
(its device utilisation) without importing the model's side.
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import time
from pathlib import Path

__all__ = ["SimDevice", "read_busy_s"]

_COUNTER = struct.Struct("<q")  # busy nanoseconds, at offset 0 of the device file


class SimDevice:
    """The host's one simulated device: a file whose lock serialises every process's
    device phase and whose first 8 bytes count the nanoseconds it was busy."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._local = threading.Lock()  # flock excludes processes, not threads
        self._last: tuple[float, int] | None = None
        self._util = 0.0

    def run(self, seconds: float) -> float:
        """Hold the device for ``seconds`` (waiting without the interpreter lock);
        return the time spent queueing for it behind other processes."""
        with self._local:
            t0 = time.perf_counter()
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            queued = time.perf_counter() - t0
            try:
                time.sleep(seconds)
                os.pwrite(self._fd, _COUNTER.pack(_busy_ns(self._fd) + int(seconds * 1e9)), 0)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        return queued

    def utilisation(self) -> float:
        """Busy share of the device since the previous call at least 0.5 s ago (0..1)."""
        now = time.monotonic()
        if self._last is not None and now - self._last[0] < 0.5:
            return self._util  # asked after every batch: read the file twice a second
        busy = _busy_ns(self._fd)
        if self._last is not None:
            then, before = self._last
            self._util = min(1.0, max(0.0, (busy - before) / 1e9 / (now - then)))
        self._last = (now, busy)
        return self._util

    def close(self) -> None:
        os.close(self._fd)


def _busy_ns(fd: int) -> int:
    """The busy counter of the device file open at ``fd`` (0 while it is empty)."""
    return int(_COUNTER.unpack(os.pread(fd, 8, 0).ljust(8, b"\0"))[0])


def read_busy_s(path: Path) -> float:
    """The busy counter of the device file at ``path`` (0 when there is none yet)."""
    try:
        with path.open("rb") as f:
            return _busy_ns(f.fileno()) / 1e9
    except FileNotFoundError:
        return 0.0
