"""The model process itself (``python -m pipeline.inference.process_child TOK FWD``):
what :class:`~pipeline.inference.process.RemoteModel` starts.

It loads the model, says it is ready (or why not) on the forward pipe, then
serves both pipes on three threads: the tokenizer thread prepares batches and
keeps their tensors; the main thread runs the forwards in order, each answered
by its handle as soon as it is done; a third reads the worker's requests for
batches that were not queued when they were tokenized. A batch tokenized
"ahead" is queued for its forward the moment it is prepared, so the device
goes from one batch to the next without waiting for the worker, whose
interpreter lock the event loop wants (docs/design.md, "Forwards queued
ahead"). Such a batch gets no answer of its own on the tokenizer pipe: its
counts, its tokenisation time, or why it could not be tokenised come with its
forward's answer, so a batch costs the worker's threads one message each way
(docs/design.md, "One message each way"). The child exits when the worker's
pipes close.
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from pipeline.errors import ConfigurationError
from pipeline.inference.types import Encoded
from pipeline.settings import ModelSettings

__all__ = ["PREPARED", "Ready"]

#: Prepared batches the child keeps for the forwards to come (the engine prepares one
#: ahead; a batch never forwarded, its caller gone, is dropped past this).
PREPARED = 8


#: A batch as the child keeps it: the tensors and the seconds tokenising took, or why
#: it could not be tokenized.
Prepared = tuple[Encoded, float] | Exception


@dataclasses.dataclass(frozen=True)
class Ready:
    """What the child says once the model is loaded."""

    device: str
    kind: str
    max_length: int
    fingerprint: str
    tokenizer_json: str | None
    device_uuid: str | None


def _child_main(tok: Connection, fwd: Connection) -> None:
    """The model process: read its settings, load, say ready (or why not), then serve
    both pipes."""
    from pipeline.inference.loading import load_model
    from pipeline.inference.telemetry import cuda_uuid

    settings: ModelSettings = fwd.recv()
    try:
        model: Any = load_model(dataclasses.replace(settings, process="off"))
    except Exception as exc:
        fwd.send(("error", str(exc) if isinstance(exc, ConfigurationError) else repr(exc)))
        return
    backend = getattr(getattr(model, "_tokenizer", None), "backend_tokenizer", None)
    fwd.send(
        (
            "ready",
            Ready(
                device=str(model.device) if model.kind != "sim" else "sim",
                kind=model.kind,
                max_length=model.max_length,
                fingerprint=model.fingerprint,
                tokenizer_json=backend.to_str() if backend is not None else None,
                device_uuid=cuda_uuid(model.device.index or 0) if model.kind == "cuda" else None,
            ),
        )
    )
    batches = _Batches()
    threading.Thread(
        target=_serve_tokenize, args=(model, tok, batches), name="tokenizer", daemon=True
    ).start()
    threading.Thread(
        target=_read_forwards, args=(fwd, batches), name="requests", daemon=True
    ).start()
    _serve_forward(model, fwd, batches)


class _Batches:
    """The child's prepared batches and the forwards to run, in order: batches
    tokenized "ahead" (queued the moment they are prepared) and batches the worker
    asks for by handle; ``None`` once the worker is gone."""

    def __init__(self) -> None:
        self._prepared: collections.OrderedDict[int, Prepared] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._runs: queue.SimpleQueue[int | None] = queue.SimpleQueue()

    def keep(self, handle: int, prepared: Prepared, *, ahead: bool) -> None:
        """Keep a prepared batch (the oldest beyond :data:`PREPARED` are dropped: their
        callers are gone); ``ahead``: queue its forward now."""
        with self._lock:
            self._prepared[handle] = prepared
            while len(self._prepared) > PREPARED:
                self._prepared.popitem(last=False)
        if ahead:
            self._runs.put(handle)

    def ask(self, handle: int | None) -> None:
        """Queue the forward of ``handle`` (None: the worker is gone; stop)."""
        self._runs.put(handle)

    def next(self) -> tuple[int, Prepared | None] | None:
        """The next forward to run and its batch (None where it is not prepared here);
        None once the worker is gone."""
        handle = self._runs.get()
        if handle is None:
            return None
        with self._lock:
            return handle, self._prepared.pop(handle, None)


def _error(exc: BaseException) -> tuple[str, str, str]:
    return ("err", type(exc).__name__, str(exc))


def _serve_tokenize(model: Any, conn: Connection, batches: _Batches) -> None:
    """Tokenize each batch the worker sends; answer only those not queued ahead (a batch
    queued ahead is answered, counts and all, with its forward)."""
    while True:
        try:
            _op, handle, texts, pad_to, rows, ahead = conn.recv()
        except (EOFError, OSError):
            return
        t0 = time.perf_counter()
        try:
            enc = model.tokenize(texts, pad_to=pad_to, rows=rows)
        except Exception as exc:
            if ahead:  # its forward answers with the error
                batches.keep(handle, exc, ahead=True)
            else:
                conn.send(_error(exc))
            continue
        batches.keep(handle, (enc, time.perf_counter() - t0), ahead=ahead)
        if not ahead:
            conn.send(("ok", enc.n_tokens, enc.padded_tokens))


def _read_forwards(conn: Connection, batches: _Batches) -> None:
    """The worker's requests for batches not tokenized ahead, in order; None once it is
    gone (the child then exits)."""
    while True:
        try:
            _op, handle = conn.recv()
        except (EOFError, OSError):
            batches.ask(None)
            return
        batches.ask(handle)


def _serve_forward(model: Any, conn: Connection, batches: _Batches) -> None:
    """Run the forwards in order, each answered by its handle as soon as it is done: the
    device goes from one batch to the next without waiting for the worker."""
    while (run := batches.next()) is not None:
        handle, prepared = run
        if prepared is None:
            conn.send(("err", handle, "InferenceError", f"batch {handle} is not prepared here"))
            continue
        if isinstance(prepared, Exception):  # could not be tokenized
            conn.send(("err", handle, type(prepared).__name__, str(prepared)))
            continue
        enc, tokenize_s = prepared
        try:
            t0 = time.perf_counter()
            before = model.timing.totals()[2]
            preds = model.forward(enc)
            wall = time.perf_counter() - t0
            after = model.timing.totals()[2]
        except Exception as exc:
            conn.send(("err", handle, type(exc).__name__, str(exc)))
            continue
        wait = None if after is None else after - (before or 0.0)
        if preds and preds[0].embedding is not None:
            body: Any = ("embed", b"".join(p.embedding for p in preds), len(preds))
        else:
            body = ("labels", [(p.label, p.score) for p in preds])
        counts = (enc.n_tokens, enc.padded_tokens, tokenize_s)
        try:
            conn.send(("ok", handle, body, wall, wait, t0, counts))
        except (EOFError, OSError):
            return


if __name__ == "__main__":  # the model process: python -m pipeline.inference.process_child TOK FWD
    # Run the module's own copy, not this __main__ one: what it pickles must name
    # pipeline.inference.process_child, where the worker looks for it.
    from pipeline.inference.process_child import _child_main as main

    main(*(Connection(int(fd)) for fd in sys.argv[1:3]))
