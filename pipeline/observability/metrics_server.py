"""The worker's ``/metrics`` endpoint: a registry served over HTTP.

:func:`start_metrics_server` serves a :class:`~pipeline.observability.metrics.PipelineMetrics`
registry with prometheus_client's own HTTP server on a daemon thread, or
nothing when the settings turn the endpoint off; a port it cannot bind is a
:class:`~pipeline.errors.ConfigurationError`. The returned
:class:`MetricsServer` knows its URL and stops the server on
:meth:`~MetricsServer.close`. Both are re-exported by :mod:`pipeline.observability.metrics`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import start_http_server

from pipeline.errors import ConfigurationError
from pipeline.settings import MetricsSettings

if TYPE_CHECKING:
    from pipeline.observability.metrics import PipelineMetrics

__all__ = ["MetricsServer", "start_metrics_server"]

# The name this endpoint has always logged under (the module it came from).
log = logging.getLogger("pipeline.observability.metrics")


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint; :meth:`close` stops it (idempotent)."""

    host: str
    port: int
    _server: Any
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self, timeout_s: float = 5.0) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout_s)


def start_metrics_server(
    settings: MetricsSettings, metrics: PipelineMetrics
) -> MetricsServer | None:
    """Serve ``metrics`` at ``http://host:port/metrics`` on a daemon thread.

    Returns ``None`` when ``enabled`` is false or ``port`` is 0. A port that
    cannot be bound raises :class:`ConfigurationError` naming the setting, so
    two workers on one host never silently share (or lose) an endpoint.
    """
    if not settings.enabled or settings.port == 0:
        return None
    try:
        server, thread = start_http_server(
            settings.port, addr=settings.host, registry=metrics.registry
        )
    except OSError as exc:
        raise ConfigurationError(
            f"cannot serve metrics on {settings.host}:{settings.port} ({exc}); set "
            "PIPELINE_METRICS_PORT to a free port, or 0 to disable the endpoint"
        ) from exc
    port = int(server.server_address[1])
    log.info("metrics at http://%s:%d/metrics", settings.host, port)
    return MetricsServer(settings.host, port, server, thread)
