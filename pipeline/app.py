"""The Faust app: topics, agents, table and wiring. Run it with::

    faust -A pipeline.app worker -l info

This is the one place that knows the order of the stages; the stages
themselves live in their own modules and know nothing of Faust. The lane
topics are subscribed through Faust, but their records are taken from each
fetch in one batch (:mod:`pipeline.kafka.faust_edge`) into a lane buffer, and the
lane reader feeds them to the runtime, realtime first (docs/design.md,
"Intake in batches"). Values arrive as raw bytes and are decoded by the
runtime, so no input can make Faust ack a record before its result or dead
letter exists (docs/design.md, delivery rules).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import sys
from typing import Any, cast

import faust
from mode import Service

from pipeline.codecs.keys import InputKeys
from pipeline.codecs.lengths import TokenLengths
from pipeline.codecs.registry import AnswerHeaders, register_answer_schemas
from pipeline.errors import ConfigurationError
from pipeline.inference import (
    DeviceTelemetry,
    InferenceEngine,
    SimTelemetry,
    device_utilisation,
    load_model,
    telemetry_for,
)
from pipeline.kafka import faust_conf, faust_edge
from pipeline.kafka.faust_app import PipelineApp, use_event_loop, worker_class
from pipeline.kafka.producer import AnswerProducer
from pipeline.kafka.topic_limits import warn_small_topics
from pipeline.observability.logs import configure_logging
from pipeline.observability.metrics import MetricsServer, PipelineMetrics, start_metrics_server
from pipeline.observability.stalls import StallWatch
from pipeline.scheduling.calibrate import calibrate
from pipeline.settings import Settings
from pipeline.worker.dedupe import TABLE_NAME, Retention, StoredResults
from pipeline.worker.lane_reader import Consumer as ReaderConsumer
from pipeline.worker.lane_reader import LaneReader
from pipeline.worker.ledger import Ledger
from pipeline.worker.preflight import preflight
from pipeline.worker.publish import Publisher
from pipeline.worker.runtime import Runtime, wall_ms

__all__ = ["app", "create_app", "settings"]

log = logging.getLogger(__name__)

#: Net new container objects between two collections of the young generation, once
#: serving (Python's default: 700). A no-op worker under a backlog spent ~8 % of its
#: time in the collector at 700 (all three generations, a full collection of ~25 ms
#: every ~0.6 s) and ~1 % at this, with one young collection of ~25 ms every ~2.5 s,
#: for ~20 MB more peak memory (docs/design.md, "The garbage collector's threshold").
YOUNG_GC_THRESHOLD = 100_000

#: The interpreter's switch interval once serving (Python's default: 5 ms). The
#: worker's helper threads (the engine's two, which talk to the model process; Faust's
#: consumer thread; the producer's poller) each need the lock for microseconds at a
#: time, and a busy event loop handed it over only every 5 ms: a batch's trip through
#: the model process waited ~15 ms of 27-33 for it. At 1 ms, six alternating pairs on
#: the graphed sim profile: 0 % repeats 10,320/s against 9,830 (means), a noop worker
#: unchanged (docs/design.md, "The interpreter's switch interval").
SWITCH_INTERVAL_S = 0.001


def create_app(settings: Settings, answer_headers: AnswerHeaders | None = None) -> faust.App:
    """Build the Faust app for ``settings``; nothing connects until the worker starts.
    ``answer_headers``: answers in the Schema Registry's framing (registered already)."""
    s = settings
    app = PipelineApp(
        s.worker.app_id,
        Worker=worker_class(s),
        broker_client_id=s.kafka.client_id,
        store="rocksdb://",
        producer_acks=-1,
        producer_linger=s.worker.producer_linger_ms / 1000,
        **faust_conf.app_conf(s),
    )
    # PIPELINE_WORKER_LANES: this fleet's lanes.
    lane_topics = faust_conf.lane_topics(app, s, s.worker.consumed_lanes())
    retention = Retention.of_seconds(s.dedupe.ttl_s)  # the dedupe TTL's one owner
    table = app.Table(
        TABLE_NAME,
        key_type=bytes,  # bytes types make Faust use the raw serializer
        value_type=bytes,
        partitions=s.topics.partitions,
        options=retention.table_options(s.dedupe.store_memory_mib),
        extra_topic_configs=retention.changelog_config(),
    )
    faust_edge.filter_memtables(table)  # before any partition's store opens
    lane_of_topic = {topic.get_topic_name(): lane for lane, topic in lane_topics.items()}
    holder = _RuntimeHolder(
        app,
        s,
        table=table,
        retention=retention,
        lane_of_topic=lane_of_topic,
        answer_headers=answer_headers,
    )
    app.rebalance_hooks.append(holder.on_rebalance_start)
    app.stop_hooks.append(holder.on_stopping)
    app.service(holder)  # type: ignore[arg-type]  # instances are accepted too
    for topic in lane_topics.values():
        app.topics.add(topic)  # subscribed (and acked) through Faust; read by the lane reader

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def _forget_revoked(sender: Any, revoked: Any, **kwargs: Any) -> None:
        # Faust commits the acked prefix before this; the rest is redelivered
        # to whoever gets the partition, so stop tracking it here.
        lanes = [tp for tp in revoked if tp.topic in lane_of_topic]
        if holder.runtime is not None:
            holder.runtime.revoked(lanes)
        else:
            holder.ledger.revoked(lanes)

    lane_names = frozenset(lane_of_topic)

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def _look_up_starts(sender: Any, assigned: Any, **kwargs: Any) -> None:
        # Records are buffered from the first assignment on, maybe before the holder
        # starts: a rebalance from then on must reach the worker's loop (on_rebalance_start).
        holder.on_loop(asyncio.get_running_loop())
        holder.watch_recovery()
        holder.ledger.assigned(
            (tp.topic, tp.partition) for tp in assigned if tp.topic in lane_names
        )

    faust_edge.install(
        lane_names,
        holder.ledger.fetched,
        fetch_max_wait_ms=settings.kafka.fetch_max_wait_ms,
        isolation_level=settings.kafka.isolation_level,
        passed=holder.passed,
    )

    return app


class _RuntimeHolder(Service):
    """Loads the model and runs the batch loop for the life of the worker."""

    def __init__(
        self,
        app: faust.App,
        settings: Settings,
        *,
        table: Any,
        retention: Retention,
        lane_of_topic: dict[str, str],
        answer_headers: AnswerHeaders | None = None,
    ) -> None:
        self.app = app
        self.answer_headers = answer_headers
        self.settings = settings
        self.table = table
        self.retention = retention
        self.runtime: Runtime | None = None
        self.changelog: faust_edge.ChangelogStore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.engine: InferenceEngine | None = None
        self.fallback: InferenceEngine | None = None
        self.model: Any = None
        self.telemetry: DeviceTelemetry | SimTelemetry | None = None
        self.metrics_server: MetricsServer | None = None
        self.stalls: StallWatch | None = None
        self._recovery_watch: asyncio.Future[None] | None = None
        self.answer_producer: AnswerProducer | None = None
        # One registry from the start: the recovery watch and the passed offsets count
        # from the first assignment, before on_start serves them.
        self.metrics = PipelineMetrics()
        self.ready = asyncio.Event()
        # Offsets the fetcher walked past without a record: holes the reader passes at once.
        self.passed = faust_edge.PassedOffsets(lane_of_topic)
        # The one keeper of lane records' offsets, from the first assignment on (before
        # the runtime exists); the runtime owns it once made. app.consumer is made when
        # the worker starts: look it up at each call.
        self.ledger = Ledger(
            settings,
            lane_of_topic,
            clock_ms=wall_ms,
            pause=lambda tp: faust_edge.pause_fetch(app.consumer, tp),
            resume=lambda tp: faust_edge.resume_fetch(app.consumer, tp),
            forget=lambda records: faust_edge.forget(app.consumer, records),
            explains=self.passed.explains,
            forget_passed=self.passed.forget,
        )
        self.reader = LaneReader(
            self.ledger,
            ReaderConsumer(
                seek=lambda tp, offset: faust_edge.seek(app.consumer, tp, offset),
                add_gap=lambda tp, low, high: faust_edge.add_gap(app.consumer, tp, low, high),
                start_offset=self.ledger.starts.get,
                position=lambda tp: faust_edge.position(app.consumer, tp),
                pass_end=lambda tp, low, high: faust_edge.pass_end(app.consumer, tp, low, high),
            ),
            on_passed=self.metrics.offsets_passed,
        )
        super().__init__()

    def on_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The worker's event loop, known from the first assignment on."""
        self._loop = self._loop or loop

    def on_rebalance_start(self) -> None:
        """Called on the consumer's thread: hand the give-up to the worker's loop. A
        rebalance before the holder started (between the first assignment and Faust's
        services starting) drops the buffered records too: Faust's revoke waits for
        every one (``wait_empty``), and nothing would take them meanwhile."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._give_up_unstarted)

    def on_stopping(self) -> None:
        """The worker stops: give up unstarted work and every lane record fetched, now
        and until the consumer has stopped."""
        if self._recovery_watch is not None:
            self._recovery_watch.cancel()
        self.reader.stop()
        self._give_up_unstarted("stopping")

    def _give_up_unstarted(self, why: str = "rebalance") -> None:
        if self.runtime is not None:
            self.runtime.give_up_unstarted(why)
            return
        _stranded, dropped = self.ledger.give_up()
        if dropped:
            log.info("%s: %d buffered lane records dropped (read again after it)", why, dropped)

    async def on_start(self) -> None:
        s = self.settings
        self._loop = asyncio.get_running_loop()
        configure_logging(
            s.log, allow_payloads=s.worker.log_payloads, static={"app": s.worker.app_id}
        )
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
        self.model = model
        self.telemetry = telemetry_for(model, s.model.sim_path)
        self.metrics.model(s.model.display_name, s.model.version, str(model.device), s.model.task)
        self.answer_producer = AnswerProducer(s, on_fatal=self._answer_path_failed)
        self.answer_producer.start()
        # A topic that refuses the largest answer: one line saying what to set.
        await loop.run_in_executor(None, warn_small_topics, s)
        publisher = Publisher(
            self.answer_producer.send,
            results_topic=s.topics.results_topic,
            dlq_topic=s.topics.dlq_topic,
            send_nowait=self.answer_producer.send_nowait,
            headers=self.answer_headers,
        )
        self.changelog = faust_edge.ChangelogStore(
            self.table, self.answer_producer.produce_nowait, wal=s.dedupe.store_wal
        )
        stored = StoredResults(self.changelog, retention=self.retention, clock_ms=wall_ms)
        self.runtime = Runtime(
            s,
            engine=self.engine,
            publisher=publisher,
            ack=faust_edge.releaser(lambda: self.app.consumer),
            ledger=self.ledger,
            stored=stored,
            store_in_context=faust_edge.in_partition_of,
            metrics=self.metrics,
            fallback=fallback,
            fallback_model=fallback_model,
            keys=model.keys,
            lengths=TokenLengths.of(model.keys) if isinstance(model.keys, InputKeys) else None,
            on_room=self.reader.wake,
            on_failure=self._answer_path_failed,
            utilisation=device_utilisation(self.telemetry, self.engine.busy_fraction),
        )
        await calibrate(self.engine, self.runtime.controller, self.runtime.scheduler.shapes)
        # A full collection walks every tracked object: with torch, transformers and Faust
        # loaded, about 300 ms here, while the event loop (and every thread needing the
        # GIL) stands still. What exists now lives as long as the worker: freeze it out
        # of the collector's walks, so they only visit what serving creates.
        gc.collect()
        gc.freeze()
        # And collect the young generation every YOUNG_GC_THRESHOLD net new objects, not
        # Python's 700: every request's objects outlive a few hundred allocations (they
        # wait in queues), so at 700 they were walked young, then again in the middle
        # and the old generations (docs/design.md, "The garbage collector's threshold").
        gc.set_threshold(YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        log.info(
            "garbage collector: %d start-up objects frozen, young generation every %d; "
            "switch interval %g ms",
            gc.get_freeze_count(),
            YOUNG_GC_THRESHOLD,
            sys.getswitchinterval() * 1000,
        )
        self.add_future(self.runtime.run())
        self.add_future(self.reader.run(self.runtime))
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
        """Seek again where a seek back to skipped records got no answer, and look for
        offsets passed at partitions' ends (worker/continuity.py); record the dedupe
        changelog's delivered offsets in its store."""
        while True:
            await asyncio.sleep(interval_s)
            if self.changelog is not None:
                self.changelog.flush_offsets()
            for tp, offset in self.ledger.continuity.overdue():
                log.warning("%s: seek back to %d got no records; seeking again", tp, offset)
                with contextlib.suppress(Exception):  # revoked meanwhile: nothing to redo
                    await faust_edge.seek(self.app.consumer, tp, offset)
            await self.reader.check_ends()

    def watch_recovery(self) -> None:
        """Start the watch on Faust's recovery of the stored results, once, at the first
        assignment: Faust starts the app's services only after the first recovery is
        complete, and that one may be the recovery that stalls."""
        if self._recovery_watch is None:
            self._recovery_watch = asyncio.ensure_future(self._watch_recovery())

    async def _watch_recovery(self, interval_s: float = 1.0) -> None:
        """A recovery never holds a partition's lanes for long (faust_edge/recovery_watch.py);
        a loop of its own, as a reading again waits on the consumer's thread."""
        consumer = self.app.consumer
        watch = faust_edge.RecoveryWatch(
            cast(Any, self.app.tables).recovery,  # Faust's TableManager; not on its type
            consumer.seek_wait,
            lambda tp: faust_edge.position(consumer, tp),
            stall_s=self.settings.dedupe.recovery_stall_s,
            on_action=self.metrics.recovery_stall,
        )
        while True:
            await asyncio.sleep(interval_s)
            try:
                await watch.check()
            except Exception:  # a watch that fails must not take the worker with it
                log.exception("the watch on the stored results' recovery failed")

    async def _sample_device(self) -> None:
        """Device telemetry and consumer lag, every ``metrics.sample_interval_s``."""
        from pipeline.observability.sampling import sample_once

        while True:
            await asyncio.sleep(self.settings.metrics.sample_interval_s)
            with contextlib.suppress(Exception):  # telemetry must never hurt the worker
                sample_once(self.metrics, self.telemetry, self.app.consumer)
                _calls, forward_s, lock_wait_s = self.model.timing.totals()
                restarts = getattr(self.model, "restarts", 0)
                self.metrics.model_timing(forward_s, lock_wait_s, restarts)

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
        faust_edge.stop_worker(self.app, self, failure)


try:
    faust_edge.check()
    settings = Settings.from_env()
    preflight(settings, ports="worker" in sys.argv[1:])
    # Answers in the registry's framing: their schemas registered before the worker serves.
    answer_headers = register_answer_schemas(settings) if "worker" in sys.argv[1:] else None
except ConfigurationError as exc:  # one line, before the worker joins the group
    raise SystemExit(f"pipeline: {exc}") from None
use_event_loop(settings.worker.event_loop)
app = create_app(settings, answer_headers)
