"""The thread budget: torch's and the tokenizer's pools sized so they do not fight.

On N cores the defaults leave one core to the event loop: torch computes on
N - 1 intra-op threads, inter-op parallelism (unused by eager inference) gets
one thread, and the fast tokenizer runs on the engine's tokenizer thread alone
instead of starting a rayon pool of N spinning threads next to torch's.
"""

from __future__ import annotations

import contextlib
import os

import torch

from pipeline.settings import ModelSettings

__all__ = ["apply_thread_budget", "default_threads"]


def default_threads() -> int:
    """The cores this process may use, less one for the event loop (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores - 1)


def apply_thread_budget(settings: ModelSettings) -> dict[str, int]:
    """Size torch's and the tokenizer's thread pools; returns what is in effect.

    The tokenizer (Rust) reads ``TOKENIZERS_PARALLELISM`` at every batch but
    ``RAYON_NUM_THREADS`` only when its pool starts, at the first parallel
    batch of the process; torch's inter-op count is fixed once inter-op work
    has run. Call this before the first tokenisation (``load_model`` does).
    """
    torch.set_num_threads(settings.torch_threads or default_threads())
    interop = settings.torch_interop_threads or default_threads()
    if torch.get_num_interop_threads() != interop:
        with contextlib.suppress(RuntimeError):  # already fixed in this process
            torch.set_num_interop_threads(interop)
    # Environment variables are the tokenizer library's only knob, hence the writes.
    k = settings.tokenizer_threads
    os.environ["TOKENIZERS_PARALLELISM"] = "false" if k == 1 else "true"
    if k > 1:
        os.environ["RAYON_NUM_THREADS"] = str(k)
    else:
        os.environ.pop("RAYON_NUM_THREADS", None)
    return {
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "tokenizer_threads": k,
    }
