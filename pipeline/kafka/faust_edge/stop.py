"""Stopping the worker because an answer could not be made durable.

The worker then exits non-zero, commits only what was answered, and waits
for no unanswered input: Faust's stop would otherwise wait for every record
it handed out (``stream_wait_empty``), and mode's Worker exits zero unless
its root service has a ``crash_reason``.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

__all__ = ["stop_worker"]

log = logging.getLogger(__name__)


def stop_worker(app: Any, service: Any, failure: BaseException) -> None:
    """Stop the worker running ``app`` loudly (``service`` is one of its services):
    no waiting for unanswered records (they stay uncommitted: redelivered), a
    non-zero exit carrying ``failure``."""
    log.critical("stopping the worker: %s", failure)
    app.conf.stream_wait_empty = False
    consumer = app.consumer
    for message in list(consumer.unacked):
        consumer.unacked.discard(message)
    root = service.beacon.root.data if service.beacon.root is not None else None
    if root is not None and hasattr(root, "crash_reason"):
        root.crash_reason = failure  # mode's Worker re-raises it: a non-zero exit
    os.kill(os.getpid(), signal.SIGTERM)
