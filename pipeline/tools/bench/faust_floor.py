"""The ``faust-floor`` mode: a bare Faust agent, Faust's own ceiling on this host.

Run as ``faust -A pipeline.tools.bench.faust_floor worker`` (the bench does, with the
deployment's PIPELINE_* variables). One agent per lane topic takes raw bytes
and hands each value unchanged to a confluent-kafka ``Producer`` for the
results topic: one ``produce`` per event and nothing else (no decoding, no
store, no scheduler, no acks beyond Faust's own). Whatever the pipeline's noop
mode costs above this is the pipeline's; the rest is Faust's.

The app is configured as the pipeline's worker is
(:func:`pipeline.kafka.faust_conf.app_conf`, and the fetch wait,
:func:`pipeline.kafka.faust_edge.set_fetch_max_wait`), so both connect alike and pay
the same fetch path. (With Faust's own 1.5 s fetch wait this agent stood idle
about 1.4 s in half the runs: 4,600 or 13,000 events/s.)

The bench's side (sending, counting what reaches the results topic) is
:func:`pipeline.tools.bench.phases.faust_floor`.
"""

from __future__ import annotations

import logging
from typing import Any

import faust
from confluent_kafka import Producer

from pipeline.kafka import faust_edge
from pipeline.kafka.faust_conf import app_conf, lane_topics
from pipeline.kafka.security import client_config
from pipeline.settings import LANES, Settings

__all__ = ["create_floor_app"]

log = logging.getLogger(__name__)


def create_floor_app(settings: Settings) -> faust.App:
    """The bare app: no table, no model, one raw agent per lane topic."""
    s = settings
    faust_edge.set_fetch_max_wait(s.kafka.fetch_max_wait_ms)
    app = faust.App(s.worker.app_id, **app_conf(s))
    out = Producer({**client_config(s), "acks": "all", "linger.ms": 5})
    results = s.topics.results_topic

    def produce(value: bytes) -> None:
        while True:
            try:
                out.produce(results, value=value)
                break
            except BufferError:
                out.poll(0.05)
        out.poll(0)

    for lane, topic in lane_topics(app, s, LANES).items():

        async def floor(stream: Any) -> None:
            async for value in stream:
                produce(value)

        app.agent(topic, name=f"faust-floor.{lane}")(floor)

    async def _ready() -> None:
        log.info("pipeline ready: faust-floor, a bare agent per lane")

    app.task(_ready)

    return app


def _app_from_env() -> faust.App:
    return create_floor_app(Settings.from_env())


app = _app_from_env()
