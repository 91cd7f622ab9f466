"""Real worker processes for integration tests: ``faust -A pipeline.app worker``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer

from pipeline.kafka.client import Answer, read_answers
from pipeline.kafka.security import client_config
from pipeline.kafka.topics import create_topics
from pipeline.settings import Settings
from pipeline.tools.supervise import WorkerProcess, free_port


def _wait_for_leaders(settings: Settings, timeout_s: float = 60.0) -> None:
    """Return once the broker's metadata shows every topic of ``settings`` with all
    its partitions led. An idempotent producer that starts on a topic the broker
    does not show yet can lose its first records while reporting them delivered
    (librdkafka resets the partition's sequence numbers; seen as 2 of 1,525 acked
    requests missing from a lane in the SIGKILL fault test)."""
    consumer = Consumer({**client_config(settings), "group.id": "-"})
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            meta = consumer.list_topics(timeout=10).topics
            led = [
                t in meta
                and len(meta[t].partitions) == settings.topics.partitions
                and all(p.leader >= 0 for p in meta[t].partitions.values())
                for t in settings.topics.all_topics()
            ]
            if all(led):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"topics of {settings.topics.prefix!r} have no leaders yet")
            time.sleep(0.2)
    finally:
        consumer.close()


@dataclass
class Deployment:
    """A unique set of topics and app id on the test broker, and its settings."""

    env: dict[str, str]
    settings: Settings

    @classmethod
    def create(cls, bootstrap: str, tmp: Path, partitions: int = 3, **extra: str) -> Deployment:
        tag = uuid.uuid4().hex[:8]
        env = {
            "PIPELINE_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "PIPELINE_TOPICS_PREFIX": f"t{tag}.",
            "PIPELINE_TOPICS_PARTITIONS": str(partitions),
            "PIPELINE_WORKER_APP_ID": f"pipeline-test-{tag}",
            "PIPELINE_WORKER_EXPIRE_LANES": "",
            "PIPELINE_SCHEDULER_WINDOW_MS": "5",
            "PIPELINE_RETRY_BACKOFF_BASE_MS": "10",
            **extra,
        }
        settings = Settings.from_env(env)
        create_topics(settings)
        _wait_for_leaders(settings)
        (tmp / tag).mkdir(parents=True, exist_ok=True)
        env["PIPELINE_WORKER_DATA_DIR"] = str(tmp / tag / "worker-0")
        return cls(env=env, settings=settings)

    @contextmanager
    def worker(self, name: str = "worker-0", **extra: str) -> Iterator[WorkerProcess]:
        proc = self.spawn(name, **extra)
        try:
            proc.wait_ready()
            yield proc
        finally:
            was_running = proc.proc.poll() is None
            code = proc.stop()
        # A worker that needed SIGKILL, or crashed, fails the test that used it.
        if was_running and code != 0:
            raise AssertionError(
                f"worker did not stop cleanly on SIGTERM (exit {code}); its log's end:\n"
                + proc.log()[-4000:]
            )

    def spawn(self, name: str = "worker-0", **extra: str) -> WorkerProcess:
        """Start a worker with its own ports (and data folder, unless it is
        worker-0) and return at once; :meth:`worker` also waits and stops it."""
        env = {
            **self.env,
            "PIPELINE_WORKER_WEB_PORT": str(free_port()),
            "PIPELINE_METRICS_PORT": str(free_port()),
            **extra,
        }
        if name != "worker-0":
            base = Path(self.env["PIPELINE_WORKER_DATA_DIR"])
            env["PIPELINE_WORKER_DATA_DIR"] = str(base.with_name(name))
        return WorkerProcess.start(env, Path(env["PIPELINE_WORKER_DATA_DIR"]).with_suffix(".log"))

    def answers(self, expect: int, timeout_s: float = 120.0) -> list[Answer]:
        return list(read_answers(self.settings, expect=expect, timeout_s=timeout_s))
