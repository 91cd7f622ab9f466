"""The ``faust.App`` options the worker is built with: how it connects, where it
keeps its data and serves its web port, and how its consumer fetches; and the
lane topics it declares (:func:`lane_topics`).

Shared by the worker (:mod:`pipeline.app`) and the bench's bare Faust agent
(:mod:`pipeline.tools.bench.faust_floor`), so the two connect alike and pay the same
fetch path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pipeline.kafka.security import faust_credentials
from pipeline.settings import Settings

if TYPE_CHECKING:
    import faust
    from faust.types import TopicT

__all__ = ["app_conf", "broker_url", "consumer_conf", "lane_topics"]


def broker_url(bootstrap: str) -> str:
    """Faust's broker URL for a ``host:port[,...]`` bootstrap list."""
    return ";".join(f"kafka://{host.strip()}" for host in bootstrap.split(",") if host.strip())


def app_conf(settings: Settings) -> dict[str, Any]:
    """Connection, data folder, web server, topic defaults and consumer options."""
    s = settings
    return {
        "broker": broker_url(s.kafka.bootstrap_servers),
        "broker_credentials": faust_credentials(s.kafka_security),
        "datadir": s.worker.data_dir,
        "web_host": s.worker.web_host,
        "web_bind": s.worker.web_host,
        "web_port": s.worker.web_port,
        "topic_partitions": s.topics.partitions,
        "topic_replication_factor": s.topics.replication,
        **consumer_conf(s),
    }


def consumer_conf(settings: Settings) -> dict[str, Any]:
    """The consumer and fetch options of ``faust.App`` for ``settings``."""
    return {
        "consumer_auto_offset_reset": "earliest",
        # One batch must stay far below this; the model never runs on the loop.
        "broker_max_poll_interval": 300.0,
        "stream_buffer_maxsize": settings.batch.stream_buffer,
    }


def lane_topics(app: faust.App, settings: Settings, lanes: Iterable[str]) -> dict[str, TopicT]:
    """``{lane: topic}``: each of ``lanes``' topics declared on ``app`` as raw bytes
    (key and value), with the lanes' shared partition count."""
    return {
        lane: app.topic(
            settings.topics.lane_topic(lane),
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=settings.topics.partitions,
        )
        for lane in lanes
    }
