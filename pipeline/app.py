"""The Faust app: topics, agents, table and wiring. Run it with::

    faust -A pipeline.app worker -l info

This is the one place that knows the order of the stages; the stages
themselves live in their own modules and know nothing of Faust. Values arrive
as raw bytes and are decoded inside the agent, so no input can make Faust ack
a record before its result or dead letter exists (docs/design.md, delivery rules).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, cast

import faust
from mode import Service

from pipeline import faust_edge
from pipeline.answer_producer import AnswerProducer
from pipeline.calibrate import calibrate
from pipeline.continuity import Continuity
from pipeline.dedupe import TABLE_NAME, StoredResults, changelog_config
from pipeline.errors import ConfigurationError
from pipeline.faust_conf import app_conf
from pipeline.inference import DeviceTelemetry, InferenceEngine, load_model
from pipeline.logs import configure_logging
from pipeline.metrics import MetricsServer, PipelineMetrics, start_metrics_server
from pipeline.preflight import preflight
from pipeline.publish import Origin, Publisher
from pipeline.settings import LANES, Settings
from pipeline.stalls import StallWatch
from pipeline.start_offsets import StartOffsets
from pipeline.worker import Incoming, Runtime, wall_ms

__all__ = ["app", "create_app", "settings"]

log = logging.getLogger(__name__)


def create_app(settings: Settings) -> faust.App:
    """Build the Faust app for ``settings``; nothing connects until the worker starts."""
    s = settings
    app = _App(
        s.worker.app_id,
        Worker=_worker_class(s),
        broker_client_id=s.kafka.client_id,
        store="rocksdb://",
        producer_acks=-1,
        producer_linger=s.worker.producer_linger_ms / 1000,
        **app_conf(s),
    )
    lane_topics = {
        lane: app.topic(
            s.topics.lane_topic(lane),
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=s.topics.partitions,
        )
        for lane in LANES
    }
    table = app.Table(
        TABLE_NAME,
        key_type=bytes,  # bytes types make Faust use the raw serializer
        value_type=bytes,
        partitions=s.topics.partitions,
        options={"ttl": s.dedupe.ttl_s},
        # compact,delete: entries past the TTL are never served, so they leave the changelog.
        extra_topic_configs=changelog_config(s.dedupe.ttl_s),
    )
    holder = _RuntimeHolder(app, s, table)
    app.rebalance_hooks.append(holder.on_rebalance_start)
    app.service(holder)  # type: ignore[arg-type]  # instances are accepted too
    for lane, topic in lane_topics.items():
        app.agent(topic, name=f"pipeline.lane.{lane}")(_lane_agent(lane, holder))

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def _forget_revoked(sender: Any, revoked: Any, **kwargs: Any) -> None:
        # Faust commits the acked prefix before this; the rest is redelivered
        # to whoever gets the partition, so stop tracking it here.
        for tp in revoked:
            holder.continuity.forget(tp)
            holder.start_offsets.forget((tp.topic, tp.partition))
            if holder.runtime is not None:
                holder.runtime.forget_partition(tp.topic, tp.partition)

    lane_names = frozenset(topic.get_topic_name() for topic in lane_topics.values())

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def _look_up_starts(sender: Any, assigned: Any, **kwargs: Any) -> None:
        holder.start_offsets.assigned(
            (tp.topic, tp.partition) for tp in assigned if tp.topic in lane_names
        )

    faust_edge.install(lane_names)

    return app


def _worker_class(settings: Settings) -> type[faust.Worker]:
    """The ``faust worker`` command's Worker: the pipeline's log format from the first
    log line (Faust's own start-up lines included). With ``PIPELINE_LOG_FORMAT=json``
    the facts of Faust's start-up banner are one JSON line too; the banner itself is
    printed to stdout by the command, which ``faust --quiet`` leaves out."""

    class Worker(faust.Worker):  # the name shows in its log lines: "[^Worker]: Ready"
        def on_setup_root_logger(self, logger: Any, level: int) -> None:
            super().on_setup_root_logger(logger, level)
            configure_logging(
                settings.log,
                allow_payloads=settings.worker.log_payloads,
                static={"app": settings.worker.app_id},
            )
            if settings.log.format == "json":
                log.info(
                    "faust-streaming %s worker starting",
                    faust.__version__,
                    extra={
                        "broker": settings.kafka.bootstrap_servers,
                        "web": f"http://{settings.worker.web_host}:{settings.worker.web_port}",
                        "datadir": settings.worker.data_dir,
                    },
                )

    return Worker


class _App(faust.App):
    """A Faust app that says when a rebalance starts, before Faust waits for every
    record its agents took (``wait_empty``): the pipeline then gives up work it has
    not started, so the revoke waits only for running batches (docs/design.md)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rebalance_hooks: list[Callable[[], None]] = []

    def on_rebalance_start(self) -> None:
        super().on_rebalance_start()
        for hook in self.rebalance_hooks:
            hook()


class _RuntimeHolder(Service):
    """Loads the model and runs the batch loop for the life of the worker."""

    def __init__(self, app: faust.App, settings: Settings, table: Any) -> None:
        self.app = app
        self.settings = settings
        self.table = table
        self.runtime: Runtime | None = None
        self.changelog: faust_edge.ChangelogStore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.engine: InferenceEngine | None = None
        self.fallback: InferenceEngine | None = None
        self.telemetry: DeviceTelemetry | None = None
        self.metrics_server: MetricsServer | None = None
        self.stalls: StallWatch | None = None
        self.answer_producer: AnswerProducer | None = None
        self.metrics = PipelineMetrics(process_collectors=False)
        self.ready = asyncio.Event()
        self.continuity = Continuity()
        self.start_offsets = StartOffsets(settings)
        super().__init__()

    def on_rebalance_start(self) -> None:
        """Called on the consumer's thread: hand the give-up to the worker's loop."""
        loop, runtime = self._loop, self.runtime
        if loop is not None and runtime is not None:
            loop.call_soon_threadsafe(runtime.give_up_unstarted)

    async def on_start(self) -> None:
        s = self.settings
        self._loop = asyncio.get_running_loop()
        configure_logging(
            s.log, allow_payloads=s.worker.log_payloads, static={"app": s.worker.app_id}
        )
        self.metrics = PipelineMetrics()
        self.metrics_server = start_metrics_server(s.metrics, self.metrics)
        self.stalls = StallWatch(self.metrics)
        self.stalls.install()
        loop = asyncio.get_running_loop()
        model = await loop.run_in_executor(None, load_model, s.model)
        self.engine = await self._start_engine(model)
        fallback, fallback_model = None, None
        if s.breaker.enabled and s.breaker.fallback_model_path:
            fb_settings = dataclasses.replace(s.model, path=s.breaker.fallback_model_path, name="")
            fb = await loop.run_in_executor(None, load_model, fb_settings)
            fallback = self.fallback = await self._start_engine(fb)
            fallback_model = (fb_settings.display_name, fb_settings.version)
        self.telemetry = DeviceTelemetry(model.device)
        self.metrics.model(s.model.display_name, s.model.version, str(model.device), s.model.task)
        self.answer_producer = AnswerProducer(s, on_fatal=self._answer_path_failed)
        self.answer_producer.start()
        publisher = Publisher(
            self.answer_producer.send,
            results_topic=s.topics.results_topic,
            dlq_topic=s.topics.dlq_topic,
            on_fatal=self._answer_path_failed,
        )
        self.changelog = faust_edge.ChangelogStore(self.table, self.answer_producer.send_nowait)
        stored = StoredResults(self.changelog, ttl_ms=s.dedupe.ttl_s * 1000, clock_ms=wall_ms)
        self.runtime = Runtime(
            s,
            engine=self.engine,
            publisher=publisher,
            ack=faust_edge.release,
            stored=stored,
            store_in_context=faust_edge.in_event_context,
            metrics=self.metrics,
            fallback=fallback,
            fallback_model=fallback_model,
            forget=lambda tokens: faust_edge.forget(
                self.app.consumer, [event.message for _stream, event in tokens]
            ),
            keys=model.keys,
        )
        await calibrate(self.engine, self.runtime.controller, self.runtime.scheduler.shapes)
        # A full collection walks every tracked object: with torch, transformers and Faust
        # loaded, about 300 ms here, while the event loop (and every thread needing the
        # GIL) stands still. What exists now lives as long as the worker: freeze it out
        # of the collector's walks, so they only visit what serving creates.
        gc.collect()
        gc.freeze()
        log.info("garbage collector: %d start-up objects frozen", gc.get_freeze_count())
        self.add_future(self.runtime.run())
        self.add_future(self.runtime.housekeeping())
        self.add_future(self._sample_device())
        self.add_future(self.stalls.run())
        self.add_future(self._every_second())
        self.ready.set()
        log.info(
            "pipeline ready: model %s on %s (event loop %s)",
            s.model.model_id,
            model.device,
            type(loop).__module__.split(".")[0],
        )

    async def _start_engine(self, model: Any) -> InferenceEngine:
        engine = InferenceEngine(model)
        engine.start()
        # The first call pays for lazy initialisation; keep it off real requests.
        await engine.run(["warm-up"])
        return engine

    async def _every_second(self, interval_s: float = 1.0) -> None:
        """Seek again where a seek back to skipped records got no answer (continuity.py);
        record the dedupe changelog's delivered offsets in its store."""
        while True:
            await asyncio.sleep(interval_s)
            if self.changelog is not None:
                self.changelog.flush_offsets()
            for tp, offset in self.continuity.overdue():
                log.warning("%s: seek back to %d got no records; seeking again", tp, offset)
                with contextlib.suppress(Exception):  # revoked meanwhile: nothing to redo
                    await self.app.consumer.seek(cast(Any, tp), offset)

    async def _sample_device(self) -> None:
        """Device telemetry and consumer lag, every ``metrics.sample_interval_s``."""
        from pipeline.sampling import sample_once

        while True:
            await asyncio.sleep(self.settings.metrics.sample_interval_s)
            with contextlib.suppress(Exception):  # telemetry must never hurt the worker
                sample_once(self.metrics, self.telemetry, self.app.consumer)

    async def on_stop(self) -> None:
        if self.stalls is not None:
            self.stalls.close()  # stopping blocks the loop on purpose: not a stall to report
        if self.runtime is not None:
            await self.runtime.close()
        loop = asyncio.get_running_loop()
        if self.answer_producer is not None:
            left = await loop.run_in_executor(None, self.answer_producer.close, 10.0)
            if left:
                log.warning("%d answers unacknowledged at stop; inputs stay uncommitted", left)
        for engine in (self.engine, self.fallback):
            if engine is not None:
                await loop.run_in_executor(None, engine.stop, 10.0)
        if self.metrics_server is not None:
            self.metrics_server.close()
        if self.telemetry is not None:
            self.telemetry.close()
        if self.stalls is not None:
            self.stalls.close()

    def _answer_path_failed(self, failure: BaseException) -> None:
        """Stop the worker loudly: it exits non-zero, commits only what was answered,
        and waits for no unanswered input (each stays uncommitted: redelivered)."""
        log.critical("stopping the worker: %s", failure)
        self.app.conf.stream_wait_empty = False
        for message in list(self.app.consumer.unacked):
            self.app.consumer.unacked.discard(message)
        root = self.beacon.root.data if self.beacon.root is not None else None
        if root is not None and hasattr(root, "crash_reason"):
            root.crash_reason = failure  # mode's Worker re-raises it: a non-zero exit
        os.kill(os.getpid(), signal.SIGTERM)


def _lane_agent(lane: str, holder: _RuntimeHolder) -> Callable[[Any], Any]:
    async def consume(stream: Any) -> None:
        await holder.ready.wait()
        runtime = holder.runtime
        assert runtime is not None
        manual = stream.noack()
        async for event in manual.events():
            msg = event.message
            if not holder.continuity.knows(msg.tp):
                start = await holder.start_offsets.get((msg.topic, msg.partition))
                if start is None:  # revoked while its start was looked up: not ours
                    faust_edge.forget(holder.app.consumer, [msg])
                    continue
                holder.continuity.start_at(msg.tp, start)
            verdict = holder.continuity.check(msg.tp, msg.offset)
            if verdict.seek_to is not None:
                log.error(
                    "%s[%d]: records %d..%d were skipped by the consumer; reading them again",
                    msg.topic,
                    msg.partition,
                    verdict.seek_to,
                    msg.offset - 1,
                )
                await holder.app.consumer.seek(msg.tp, verdict.seek_to)
            if verdict.accepted_hole is not None:
                low, high = verdict.accepted_hole
                log.warning(
                    "%s[%d]: offsets %d..%d do not exist (accepted as a gap)",
                    msg.topic,
                    msg.partition,
                    low,
                    high,
                )
                await faust_edge.add_gap(holder.app.consumer, msg.tp, low, high)
            if not verdict.process:
                # Not answered here (a second copy, or buffered before a seek): Faust
                # must stop waiting for its ack, or a stopping worker waits forever.
                faust_edge.forget(holder.app.consumer, [msg])
                continue
            incoming = Incoming(
                lane=lane,
                origin=Origin(
                    topic=msg.topic,
                    partition=msg.partition,
                    offset=msg.offset,
                    timestamp_ms=int((msg.timestamp or 0) * 1000),
                    key=msg.key,
                    value=msg.value,
                ),
                token=(manual, event),
            )
            if not await runtime.submit(incoming):  # a rebalance started: not ours
                faust_edge.forget(holder.app.consumer, [msg])

    consume.__name__ = f"{lane}_lane"
    return consume


def use_event_loop(kind: str) -> None:
    """Make the loop Faust creates next a uvloop one (``kind == "uvloop"``).

    Called when the worker imports this module, before Faust creates its loop.
    """
    if kind == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


try:
    faust_edge.check()
    settings = Settings.from_env()
    preflight(settings, ports="worker" in sys.argv[1:])
except ConfigurationError as exc:  # one line, before the worker joins the group
    raise SystemExit(f"pipeline: {exc}") from None
use_event_loop(settings.worker.event_loop)
app = create_app(settings)
