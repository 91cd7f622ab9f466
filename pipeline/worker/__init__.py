"""The worker's core: a lane record from the fetch to its answer and released offset."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.worker.runtime import Incoming, Runtime, wall_ms

__all__ = ["Incoming", "Runtime", "wall_ms"]


def __getattr__(name: str) -> Any:
    # On first use only: the runtime pulls in the model stack (torch, seconds to
    # import), and pipeline.publish imports from this package while the runtime
    # imports pipeline.publish.
    if name in __all__:
        from pipeline.worker import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
