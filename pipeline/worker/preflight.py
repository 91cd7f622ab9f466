"""Checks a worker runs before it joins its consumer group.

A worker that fails after joining makes the whole group rebalance twice (once
as it joins, once as it leaves), on every restart of a crash loop. So every
setting that can be checked without the broker is checked when ``pipeline.app``
is imported, and a bad one stops the worker with one line naming what to set:
the model's task, device and folder (and the fallback model's), the ports the
worker binds, and its data folder.
"""

from __future__ import annotations

import dataclasses
import errno
import socket
import tempfile
from pathlib import Path

from pipeline.errors import ConfigurationError
from pipeline.settings import Settings
from pipeline.settings.tasks import task_of

__all__ = ["preflight"]


def preflight(settings: Settings, *, ports: bool = True) -> None:
    """Raise ConfigurationError (one line, naming the setting) for the first setting of
    ``settings`` a worker could not start with; ``ports=False`` skips the ports (for a
    process that imports the app without serving, e.g. ``faust -A pipeline.app agents``)."""
    from pipeline.inference.loading import check_model_settings

    model = settings.model
    if task_of(model.task).runs_model:
        check_model_settings(model)
    if settings.breaker.enabled and settings.breaker.fallback_model_path:
        fallback = dataclasses.replace(model, path=settings.breaker.fallback_model_path)
        try:
            check_model_settings(fallback)
        except ConfigurationError as exc:
            raise ConfigurationError(f"PIPELINE_BREAKER_FALLBACK_MODEL_PATH: {exc}") from None
    w, m = settings.worker, settings.metrics
    if ports:
        _bindable(w.web_host, w.web_port, "PIPELINE_WORKER_WEB_PORT")
        if m.enabled and m.port:
            _bindable(m.host, m.port, "PIPELINE_METRICS_PORT")
    _writable(Path(w.data_dir).expanduser(), "PIPELINE_WORKER_DATA_DIR")


def _bindable(host: str, port: int, name: str) -> None:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            why = "in use (another worker?)" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise ConfigurationError(
                f"{name}={port}: cannot listen on {host}:{port}, {why}; give each worker "
                "on a host its own port"
            ) from None


def _writable(folder: Path, name: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise ConfigurationError(
            f"{name}={str(folder)!r}: not a writable folder ({exc.strerror}); point it at "
            "one this worker may write (its RocksDB tables live there)"
        ) from None
