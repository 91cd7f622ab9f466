"""The Faust app and Worker classes the pipeline runs in (wired by ``pipeline.app``).

:class:`PipelineApp` says when a rebalance starts and when the worker stops,
before Faust waits for every record its agents took, so the pipeline can give
up work it has not started (docs/design.md, "Rebalances"); :func:`worker_class`
makes the ``faust worker`` command log in the pipeline's format from its first
line; :func:`use_event_loop` picks the loop Faust creates.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import sys
from collections.abc import Callable
from typing import Any

import faust

from pipeline.observability.logs import configure_logging
from pipeline.settings import Settings

__all__ = ["PipelineApp", "use_event_loop", "worker_class"]

log = logging.getLogger(__name__)


def worker_class(settings: Settings) -> type[faust.Worker]:
    """The ``faust worker`` command's Worker: the pipeline's log format from the first
    log line (Faust's own start-up lines included), Python's fault handler on (a
    native crash logs every thread's stack), and SIGUSR2 logged instead of starting
    mode's debugger. With ``PIPELINE_LOG_FORMAT=json``
    the facts of Faust's start-up banner are one JSON line too; the banner itself is
    printed to stdout by the command, which ``faust --quiet`` leaves out."""

    class Worker(faust.Worker):  # the name shows in its log lines: "[^Worker]: Ready"
        def _on_sigusr2(self) -> None:
            # mode's handler calls pdb.set_trace() on the event loop: under a terminal
            # the worker freezes at a prompt (heartbeats, answers and all), without one
            # it quits pdb with an error. A signal sent by mistake must not do either.
            log.warning(
                "SIGUSR2 ignored: it would start a debugger on the event loop; "
                "send SIGUSR1 for the stacks of the worker's tasks"
            )

        def on_setup_root_logger(self, logger: Any, level: int) -> None:
            super().on_setup_root_logger(logger, level)
            # A crash in native code (RocksDB, librdkafka, torch) leaves every thread's
            # Python stack on stderr, not just an exit status of -11.
            faulthandler.enable(file=sys.stderr, all_threads=True)
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


class PipelineApp(faust.App):
    """A Faust app that says when a rebalance starts, before Faust waits for every
    record its agents took (``wait_empty``): the pipeline then gives up work it has
    not started, so the revoke waits only for running batches (docs/design.md)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rebalance_hooks: list[Callable[[], None]] = []
        self.stop_hooks: list[Callable[[], None]] = []

    async def on_stop(self) -> None:
        """The worker stops (SIGTERM): the hooks give up what the model has not
        started, as at a rebalance, before Faust waits for every record taken
        (``wait_empty``): the stop then waits for the running batches and their
        answers only, not for a queued backlog (read again after a restart)."""
        for hook in self.stop_hooks:
            hook()
        await super().on_stop()

    def on_rebalance_start(self) -> None:
        super().on_rebalance_start()
        for hook in self.rebalance_hooks:
            hook()


def use_event_loop(kind: str) -> None:
    """Make the loop Faust creates next a uvloop one (``kind == "uvloop"``).

    Called when the worker imports this module, before Faust creates its loop.
    """
    if kind == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
