"""The soak's readings of a running worker, without touching it: ``/proc`` for its RSS
and open file descriptors (and its model process's RSS), its data folder's size on disk
(RocksDB), and its group's lag read by a consumer that never joins the group.

:class:`Sampler` takes them every few seconds on a thread of its own; :mod:`.soak`
starts it when the load starts, and :mod:`.soak_report` reads its rows.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from pipeline.kafka.security import client_config
from pipeline.observability.logs import librdkafka_log, serve_logs
from pipeline.settings import LANES, Settings
from pipeline.tools.bench.stats import ProcProbe
from pipeline.tools.supervise import WorkerProcess

__all__ = ["Lag", "Sampler", "dir_bytes", "open_fds", "rss_bytes"]


def rss_bytes(pid: int) -> int | None:
    """VmRSS of ``pid`` now; None when it is gone."""
    return ProcProbe(pid).rss_bytes()


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def dir_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (0 when it is not there)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


class Lag:
    """The worker group's lag over the lane topics: end offsets minus committed ones,
    read through a consumer that never joins the group."""

    def __init__(self, settings: Settings) -> None:
        self._consumer = Consumer(
            {**client_config(settings), **librdkafka_log(), "group.id": settings.worker.app_id,
             "enable.auto.commit": False}
        )  # fmt: skip
        topics = settings.topics
        self._tps = [
            TopicPartition(topics.lane_topic(lane), p)
            for lane in LANES
            for p in range(topics.partitions)
        ]

    def read(self) -> int | None:
        try:
            committed = self._consumer.committed(self._tps, timeout=5)
            lag = 0
            for tp in committed:
                _low, high = self._consumer.get_watermark_offsets(tp, timeout=5)
                lag += max(high - max(tp.offset, 0), 0)
            return lag
        except Exception:  # the broker restarting: no reading this time
            return None
        finally:
            serve_logs(self._consumer)

    def close(self) -> None:
        self._consumer.close()


class Sampler:
    """Every ``every_s``: the first worker's readings, on a thread of its own."""

    def __init__(self, worker: WorkerProcess, data_dir: Path, lag: Lag, every_s: float) -> None:
        self.rows: list[dict[str, Any]] = []
        self.t0 = time.monotonic()
        self._worker, self._data_dir, self._lag, self._every = worker, data_dir, lag, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)
        self._thread.start()

    def _model_pid(self) -> int | None:
        for pid in ProcProbe(self._worker.pid).children():
            if "pipeline.inference.process_child" in ProcProbe(pid).cmdline():
                return pid
        return None

    def sample(self) -> None:
        pid, model = self._worker.pid, self._model_pid()
        self.rows.append(
            {
                "t_s": round(time.monotonic() - self.t0, 1),
                "rss_bytes": rss_bytes(pid),
                "model_rss_bytes": rss_bytes(model) if model else None,
                "open_fds": open_fds(pid),
                "rocksdb_bytes": dir_bytes(self._data_dir),
                "lag": self._lag.read(),
            }
        )

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.sample()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
