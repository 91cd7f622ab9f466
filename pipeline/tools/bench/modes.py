"""The modes under test: worker settings per mode, a deployment per mode, and ``raw``.

Worker modes run the real ``faust -A pipeline.app worker`` process, each with
its own topic prefix, app id, data folder and ports:

- ``sync``: one request per model call (max items 1, no window, no stored
  dedupe), budget fixed;
- ``fixed``: a fixed batch size and wait, one sequence bucket (no length
  bucketing), no realtime reservation, the ``fixed`` policy (no adaptation).
  Lanes and deadlines are still honoured (the scheduler always orders by lane,
  then deadline, which within a lane is arrival order);
- ``adaptive``: the defaults;

Every mode runs with load shedding off (``PIPELINE_DEGRADE_ENABLED=false``):
the saturation phases build a backlog on purpose.
- ``noop``: the defaults with the ``noop`` model (the pipeline's own cost).

``raw`` and ``st``, the model alone, are in :mod:`.alone`.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from pipeline.kafka.security import client_config
from pipeline.kafka.topics import create_topics, delete_topics_named
from pipeline.settings import ModelSettings, Settings
from pipeline.tools.bench.drive import Collector
from pipeline.tools.bench.stats import ProcProbe, Samples, scrape
from pipeline.tools.supervise import WorkerProcess, free_port

__all__ = ["WORKER_MODES", "Deployment", "mode_env", "model_settings_for", "start_worker"]

WORKER_MODES = ("adaptive", "fixed", "sync", "noop")


def mode_env(mode: str, *, fixed_batch: int, fixed_wait_ms: int, max_length: int) -> dict[str, str]:
    """The PIPELINE_* overrides that make a worker behave as ``mode``."""
    if mode == "sync":
        return {
            "PIPELINE_SCHEDULER_MAX_ITEMS": "1",
            "PIPELINE_SCHEDULER_WINDOW_MS": "0",
            "PIPELINE_SCHEDULER_POLICY": "fixed",
            "PIPELINE_DEDUPE_ENABLED": "false",
        }
    if mode == "fixed":
        budget = str(fixed_batch * max_length)
        return {
            "PIPELINE_SCHEDULER_MAX_ITEMS": str(fixed_batch),
            "PIPELINE_SCHEDULER_WINDOW_MS": str(fixed_wait_ms),
            "PIPELINE_SCHEDULER_POLICY": "fixed",
            "PIPELINE_SCHEDULER_SEQ_BUCKETS": str(max_length),
            "PIPELINE_SCHEDULER_TOKEN_BUDGET": budget,
            "PIPELINE_SCHEDULER_TOKEN_BUDGET_MIN": budget,
            "PIPELINE_SCHEDULER_TOKEN_BUDGET_MAX": budget,
            "PIPELINE_SCHEDULER_REALTIME_SHARE": "0",
        }
    if mode == "noop":
        return {"PIPELINE_MODEL_TASK": "noop"}
    if mode == "adaptive":
        return {}
    raise ValueError(f"unknown worker mode {mode!r}")


class Deployment:
    """One mode's topics, ``workers`` worker processes, answer collector and probes.

    The workers share the topics and the app id (one consumer group, so Kafka
    splits the partitions between them); each has its own web and metrics
    ports and its own data folder, as on a host that runs several. ``app`` is
    the Faust app they run (``pipeline.app``; the faust-floor mode runs its own).
    ``device_file``: the simulated device's file the workers share (``--device
    sim``), whose busy counter :meth:`device_busy_s` reads. ``per_worker``: more
    PIPELINE_* variables for each worker in turn (the ``fleets`` comparison gives
    some workers the realtime lane and a consumer group of their own).
    """

    def __init__(
        self,
        mode: str,
        *,
        bootstrap: str,
        out: Path,
        extra_env: dict[str, str],
        workers: int = 1,
        app: str = "pipeline.app",
        device_file: Path | None = None,
        per_worker: Sequence[Mapping[str, str]] = (),
        keep_topics: bool = False,
    ) -> None:
        tag = uuid.uuid4().hex[:8]
        self.keep_topics = keep_topics
        self.mode = mode
        self.device_file = device_file
        self.app = app
        self.name = f"{mode}-{tag}"
        self.env = {
            "PIPELINE_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "PIPELINE_TOPICS_PREFIX": f"bench-{mode}-{tag}.",
            "PIPELINE_WORKER_APP_ID": f"pipeline-bench-{mode}-{tag}",
            "PIPELINE_METRICS_SAMPLE_INTERVAL_S": "1",
            # A saturation phase dumps a backlog on purpose: load shedding would pause
            # bulk for its hold time (15 s) and measure that timer, not the pipeline.
            "PIPELINE_DEGRADE_ENABLED": "false",
            **extra_env,
        }
        self.worker_envs = [
            {
                **self.env,
                "PIPELINE_WORKER_DATA_DIR": str(out / "work" / f"{self.name}-{i}"),
                "PIPELINE_WORKER_WEB_PORT": str(free_port()),
                "PIPELINE_METRICS_PORT": str(free_port()),
                **(per_worker[i] if i < len(per_worker) else {}),
            }
            for i in range(workers)
        ]
        self.metrics_ports = [int(e["PIPELINE_METRICS_PORT"]) for e in self.worker_envs]
        self.settings = Settings.from_env(self.worker_envs[0])
        create_topics(self.settings)
        self.log_path = out / "work" / f"{self.name}.log"
        self.workers: list[WorkerProcess] = []
        self.collector: Collector | None = None
        self.probes: list[ProcProbe] = []
        self.ready_s = 0.0

    @property
    def metrics_port(self) -> int:
        """The first worker's metrics port."""
        return self.metrics_ports[0]

    def start(self, timeout_s: float = 300.0, *, collect: bool = True) -> None:
        """Start every worker; return once each is ready and the group has settled
        (every worker holds partitions), so no phase pays for a rebalance.
        ``collect``: read the answers into :attr:`collector`."""
        t0 = time.monotonic()
        if collect:
            self.collector = Collector(self.settings)
        for i, env in enumerate(self.worker_envs):
            log = self.log_path.with_name(f"{self.name}-{i}.log")
            self.workers.append(start_worker(self.app, env, log))
        self.probes = [ProcProbe(w.pid) for w in self.workers]
        for w in self.workers:
            w.wait_ready(max(timeout_s - (time.monotonic() - t0), 1.0))
        groups: dict[str, list[Settings]] = {}
        for env in self.worker_envs:
            worker = Settings.from_env(env)
            groups.setdefault(worker.worker.app_id, []).append(worker)
        for members in groups.values():
            if len(self.workers) > 1:
                wait_group_settled(members[0], len(members), timeout_s=60.0)
        self.ready_s = time.monotonic() - t0

    def cpu_s(self) -> float | None:
        """CPU seconds of all the workers together."""
        readings = [p.cpu_s() for p in self.probes]
        return None if not readings or None in readings else sum(r or 0.0 for r in readings)

    def peak_rss_bytes(self) -> int | None:
        """The largest peak resident memory of one worker."""
        peaks = [p for p in (probe.peak_rss_bytes() for probe in self.probes) if p]
        return max(peaks) if peaks else None

    def _model_probes(self) -> list[ProcProbe]:
        """Each worker's model process running now (its child ``python -m
        pipeline.inference.process_child``)."""
        return [
            child
            for probe in self.probes
            for child in map(ProcProbe, probe.children())
            if "pipeline.inference.process_child" in child.cmdline()
        ]

    def model_peak_rss_bytes(self) -> int | None:
        """The largest peak resident memory of one worker's model process (the one
        running now); None when no worker has one (the model on the worker's own
        thread, or the no-op model)."""
        peaks = [child.peak_rss_bytes() or 0 for child in self._model_probes()]
        return (max(peaks) or None) if peaks else None

    def model_cpu_s(self) -> tuple[frozenset[int], float] | None:
        """The model processes running now and their CPU seconds together; None when
        there are none. A phase compares two readings only when the pids are the same
        (a restarted process starts its count again)."""
        children = self._model_probes()
        readings = [child.cpu_s() for child in children]
        if not children or None in readings:
            return None
        return frozenset(c.pid for c in children), sum(r or 0.0 for r in readings)

    def device_busy_s(self) -> float | None:
        """The simulated device's busy seconds so far (all processes on it); None
        off ``sim``."""
        if self.device_file is None:
            return None
        from pipeline.inference.sim import read_busy_s

        return read_busy_s(self.device_file)

    def scrape(self) -> Samples | None:
        """Every worker's /metrics, each sample labelled ``bench_worker``; ``None``
        when one of them does not answer (totals would be short)."""
        merged: Samples = {}
        for i, port in enumerate(self.metrics_ports):
            samples = scrape(port)
            if samples is None:
                return None
            for (name, labels), value in samples.items():
                merged[(name, labels | {("bench_worker", str(i))})] = value
        return merged

    def stop(self) -> None:
        """Stop the workers and the collector; then delete the deployment's topics (its
        prefix's, and Faust's, named after each worker's app id: the fleets' split gives
        each fleet its own) unless ``keep_topics``: a broker that ran a few hundred
        benches held ~4,900 partitions and 8 GB of them."""
        for w in self.workers:
            w.stop()
        if self.collector is not None:
            self.collector.close()
        if self.keep_topics:
            return
        app_ids = sorted({e["PIPELINE_WORKER_APP_ID"] + "-" for e in self.worker_envs})
        prefixes = (self.env["PIPELINE_TOPICS_PREFIX"], *app_ids)
        try:
            delete_topics_named(self.settings, prefixes)
        except Exception as exc:  # the run's figures stand; say what was left behind
            from pipeline.tools.bench.phases import say  # (phases imports this module)

            say(f"{self.mode}: its topics were left on the broker ({type(exc).__name__}: {exc}); "
                f"delete the topics named {'*, '.join(prefixes)}* by hand")  # fmt: skip


def start_worker(app: str, env: Mapping[str, str], log_path: Path) -> WorkerProcess:
    """``faust -A <app> worker`` with ``env``'s PIPELINE_* variables replacing ours."""
    return WorkerProcess.start(env, log_path, app=app)


def wait_group_settled(settings: Settings, members: int, *, timeout_s: float) -> None:
    """Wait until the workers' consumer group is stable with ``members`` members,
    each assigned lane partitions. Raises TimeoutError otherwise."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(client_config(settings))
    group = settings.worker.app_id
    lanes = {settings.topics.lane_topic(lane) for lane in settings.worker.consumed_lanes()}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            desc = admin.describe_consumer_groups([group])[group].result(10)
        except Exception:  # not there yet
            desc = None
        if desc is not None and desc.state == ConsumerGroupState.STABLE:
            holding = [
                m for m in desc.members
                if any(tp.topic in lanes for tp in m.assignment.topic_partitions)
            ]  # fmt: skip
            if len(desc.members) == members and len(holding) == members:
                return
        time.sleep(0.5)
    raise TimeoutError(f"group {group} did not settle with {members} members in {timeout_s:.0f}s")


def model_settings_for(settings: Settings, device: str | None) -> ModelSettings:
    """The bench's model: the settings' own, on ``device`` when one was asked for."""
    model = settings.model
    return dataclasses.replace(model, device=device) if device else model
