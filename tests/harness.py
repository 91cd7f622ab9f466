"""Real worker processes for integration tests: ``faust -A pipeline.app worker``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pipeline.client import Answer, read_answers
from pipeline.settings import Settings
from pipeline.topics import create_topics

FAUST = str(Path(sys.executable).with_name("faust"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Deployment:
    """A unique set of topics and app id on the test broker, and its settings."""

    env: dict[str, str]
    settings: Settings

    @classmethod
    def create(
        cls, bootstrap: str, tmp: Path, partitions: int = 3, **extra: str
    ) -> Deployment:
        tag = uuid.uuid4().hex[:8]
        env = {
            "PIPELINE_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "PIPELINE_TOPICS_PREFIX": f"t{tag}.",
            "PIPELINE_TOPICS_PARTITIONS": str(partitions),
            "PIPELINE_WORKER_APP_ID": f"pipeline-test-{tag}",
            "PIPELINE_WORKER_EXPIRE_LANES": "",
            "PIPELINE_BATCH_MAX_WAIT_MS": "5",
            "PIPELINE_RETRY_BACKOFF_BASE_MS": "10",
            **extra,
        }
        settings = Settings.from_env(env)
        create_topics(settings)
        (tmp / tag).mkdir(parents=True, exist_ok=True)
        env["PIPELINE_WORKER_DATA_DIR"] = str(tmp / tag / "worker-0")
        return cls(env=env, settings=settings)

    @contextmanager
    def worker(self, name: str = "worker-0", **extra: str) -> Iterator[WorkerProcess]:
        env = {**self.env, "PIPELINE_WORKER_WEB_PORT": str(free_port()), **extra}
        if name != "worker-0":
            base = Path(self.env["PIPELINE_WORKER_DATA_DIR"])
            env["PIPELINE_WORKER_DATA_DIR"] = str(base.with_name(name))
        proc = WorkerProcess.start(env, Path(env["PIPELINE_WORKER_DATA_DIR"]).with_suffix(".log"))
        try:
            proc.wait_ready()
            yield proc
        finally:
            proc.stop()

    def answers(self, expect: int, timeout_s: float = 120.0) -> list[Answer]:
        return list(read_answers(self.settings, expect=expect, timeout_s=timeout_s))


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(cls, env: Mapping[str, str], log_path: Path) -> WorkerProcess:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
        full_env.update(env)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [FAUST, "-A", "pipeline.app", "worker", "-l", "info"],
                env=full_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return cls(proc=proc, log_path=log_path)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait until the model is loaded and the worker has partitions."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise RuntimeError(f"worker exited with {code}:\n{self.log()[-4000:]}")
            text = self.log()
            if "pipeline ready" in text and "Worker ready" in text:
                return
            time.sleep(0.3)
        raise TimeoutError(f"worker not ready in {timeout_s}s:\n{self.log()[-4000:]}")

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode
