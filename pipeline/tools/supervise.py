"""Start, watch and stop real worker processes (``faust -A pipeline.app worker``).

Used by the demo, the integration tests and the benchmark, so all of them
run the same command a user runs. :func:`terminate` stops any child process
the tools start (the worker, the local registry, Prometheus) the same way.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["WorkerProcess", "free_port", "terminate"]

FAUST = str(Path(sys.executable).with_name("faust"))
READY_MARKERS = ("pipeline ready", "[^Worker]: Ready")


#: The lowest port :func:`free_port` hands out.
LOWEST_PORT = 20_000


def free_port() -> int:
    """A TCP port on loopback that nobody listens on right now, below the kernel's
    ephemeral range where there is room: a port the kernel picked (port 0) is free only
    until the next outgoing connection, which the kernel may give the same port before
    the worker it was meant for binds it (a bench's worker once failed to start so)."""
    first_ephemeral = _ephemeral_start()
    rng = random.SystemRandom()
    for _ in range(50 if first_ephemeral > LOWEST_PORT else 0):
        port = rng.randrange(LOWEST_PORT, first_ephemeral)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's default where unknown)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text(encoding="ascii")
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


@dataclass
class WorkerProcess:
    """One worker process with its log file; ``stop`` leaves no process behind."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    log_start: int = 0  # the log is appended to; this run's lines start here

    @classmethod
    def start(
        cls, env: Mapping[str, str], log_path: Path, *, app: str = "pipeline.app"
    ) -> WorkerProcess:
        """Start ``faust -A <app> worker`` with ``env``'s PIPELINE_* variables replacing
        the caller's."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
        full_env.update(env)
        with open(log_path, "ab") as log:
            start = log.tell()
            proc = subprocess.Popen(
                [FAUST, "-A", app, "worker", "-l", "info"],
                env=full_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return cls(proc=proc, log_path=log_path, log_start=start)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        """What this run of the worker has logged so far."""
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(self.log_start)
            return f.read().decode(errors="replace")

    def wait_ready(self, timeout_s: float = 180.0) -> float:
        """Wait until the model is loaded and Faust says Ready; return the seconds it took.

        Raises RuntimeError (with the log's tail) if the worker exits or
        TimeoutError if it is not ready in time.
        """
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise RuntimeError(f"worker exited with {code}:\n{self.log()[-4000:]}")
            text = self.log()
            if all(marker in text for marker in READY_MARKERS):
                return time.monotonic() - start
            time.sleep(0.3)
        raise TimeoutError(f"worker not ready in {timeout_s:.0f}s:\n{self.log()[-4000:]}")

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, then SIGKILL (its process group) after ``timeout_s``; return the exit code."""
        return terminate(self.proc, timeout_s, kill_wait_s=10.0, group=True)


def terminate(
    proc: subprocess.Popen[Any],
    timeout_s: float,
    *,
    kill_wait_s: float | None = None,
    group: bool = False,
) -> int:
    """Stop ``proc`` unless it has exited: SIGTERM, then SIGKILL (to its whole process
    group with ``group``) if it is still running after ``timeout_s``, waiting up to
    ``kill_wait_s`` (default ``timeout_s``) for it to go. Returns its exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            if group:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
            proc.wait(timeout_s if kill_wait_s is None else kill_wait_s)
    return proc.returncode
