"""How the worker's Faust consumer fetches: the ``faust.App`` options it is built with.

Shared by the worker (:mod:`pipeline.app`) and the bench's bare Faust agent
(:mod:`pipeline.bench.faust_floor`), so the two pay the same fetch path.
"""

from __future__ import annotations

from typing import Any

from pipeline.settings import Settings

__all__ = ["consumer_conf"]


def consumer_conf(settings: Settings) -> dict[str, Any]:
    """The consumer and fetch options of ``faust.App`` for ``settings``."""
    return {
        "consumer_auto_offset_reset": "earliest",
        # One batch must stay far below this; the model never runs on the loop.
        "broker_max_poll_interval": 300.0,
        "stream_buffer_maxsize": settings.batch.stream_buffer,
    }
