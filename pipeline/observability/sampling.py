"""One pass of the worker's periodic readings: device telemetry and consumer lag.

``pipeline.app`` calls :func:`sample_once` every ``metrics.sample_interval_s``.
The device reading goes to the ``pipeline_device_*`` gauges (nothing on a CPU,
where ``DeviceTelemetry.sample`` is None); for every partition assigned to the
consumer, its lag, highwater minus the committed offset, goes to
``pipeline_consumer_lag`` (the gauge behind the ConsumerLagHigh alert in
``ops/``). A partition without a committed offset (nothing committed yet) or
without a highwater (nothing fetched yet) is left as it is.

Telemetry must never hurt the worker: a pass never raises. A failed reading is
logged at debug level and skipped; it stops neither the other readings nor the
next pass.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from pipeline.kafka import faust_edge
from pipeline.observability.metrics import PipelineMetrics

__all__ = ["DeviceReading", "Telemetry", "sample_once"]

log = logging.getLogger(__name__)


class DeviceReading(Protocol):
    """What ``DeviceTelemetry.sample`` returns (``pipeline.inference.DeviceSample``)."""

    @property
    def utilization_pct(self) -> float: ...

    @property
    def memory_used_bytes(self) -> int: ...

    @property
    def memory_total_bytes(self) -> int: ...


class Telemetry(Protocol):
    """``pipeline.inference.DeviceTelemetry``: a reading, or None on a CPU."""

    def sample(self) -> DeviceReading | None: ...


def sample_once(metrics: PipelineMetrics, telemetry: Telemetry | None, consumer: Any) -> None:
    """Read the device and every assigned partition's lag into ``metrics``; never raises.

    ``consumer`` is Faust's consumer (``app.consumer``): ``assignment()``, and
    ``highwater(tp)``; its committed offsets are read by
    :func:`pipeline.kafka.faust_edge.committed`.
    """
    try:
        reading = telemetry.sample() if telemetry is not None else None
        if reading is not None:
            metrics.device(
                reading.utilization_pct / 100,
                reading.memory_used_bytes,
                reading.memory_total_bytes,
            )
    except Exception:
        log.debug("device telemetry failed", exc_info=True)
    try:
        partitions = list(consumer.assignment())
    except Exception:
        log.debug("consumer assignment unavailable for the lag metric", exc_info=True)
        return
    for tp in partitions:
        try:
            committed = faust_edge.committed(consumer, tp)
            highwater = consumer.highwater(tp)
            if committed is not None and highwater is not None:
                metrics.consumer_lag(tp.topic, tp.partition, max(0, highwater - committed))
        except Exception:
            log.debug("consumer lag of %s failed", tp, exc_info=True)
