"""The model in a process of its own, so its interpreter lock is nobody else's.

An eager network makes a few hundred torch calls per forward, each dropping and
re-taking the interpreter lock; in the worker, every one of them waits behind
the event loop, Faust's consumer thread and the producer's poller (measured on
an H200: 68 % of the inference thread's time; docs/design.md, "The model in
a process of its own"). Triton's Python backend, vLLM's EngineCore and TEI's
backend all give the model a process that does nothing else; so does this.

:class:`RemoteModel` is what the worker's :class:`~.engine.InferenceEngine`
runs: the same ``tokenize`` / ``forward`` as a :class:`~.model.Model`, each a
call over its own pipe into the child (a fresh interpreter, ``python -m
pipeline.inference.process``, so no torch or CUDA state is inherited). The
child tokenizes on one thread (the engine's tokenizer stage asks) and keeps
the prepared tensors; it computes on its main thread (the engine's inference
thread asks), and answers with float32 bytes. The worker
keeps what it needs per request: the dedupe keys, built from the tokenizer's
own description, which the child sends when it is ready.

Promises:

- ``RemoteModel.start`` returns once the child has loaded the model, or raises
  :class:`~pipeline.errors.ConfigurationError` with the child's one-line reason.
- A call never waits longer than ``process_timeout_s``. A child that dies or
  hangs fails the call with :class:`ModelProcessError` (an InferenceError: the
  engine bisects, the runtime retries) and is killed; the next call starts a
  new one, at most ``process_restarts`` times in :data:`RESTART_WINDOW_S`, after
  which calls fail at once (and the circuit breaker opens) until the window
  has room again.
- ``close`` stops the child and waits for it; the child also exits when the
  worker dies (its pipes close).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from pipeline.codecs.keys import InputKeys
from pipeline.errors import ConfigurationError, InferenceError
from pipeline.inference.types import Encoded, ForwardTiming, Prediction
from pipeline.settings import ModelSettings

__all__ = ["RESTART_WINDOW_S", "ModelProcessError", "RemoteModel"]

log = logging.getLogger(__name__)

#: The window over which ``process_restarts`` is counted.
RESTART_WINDOW_S = 600.0
#: How long the child may take to load the model.
START_TIMEOUT_S = 600.0
#: Prepared batches the child keeps for the forwards to come (the engine prepares one
#: ahead; a batch never forwarded, its caller gone, is dropped past this).
_PREPARED = 8


class ModelProcessError(InferenceError):
    """The model process died, hung, or may not be restarted yet."""


@dataclasses.dataclass(frozen=True)
class _Ready:
    device: str
    kind: str
    max_length: int
    fingerprint: str
    tokenizer_json: str | None
    device_uuid: str | None


class _Backend:
    """The worker's handle on the tokenizer the child loaded: what
    :class:`~pipeline.codecs.keys.InputKeys` reads (``backend_tokenizer``)."""

    def __init__(self, tokenizer_json: str) -> None:
        from tokenizers import Tokenizer

        self.backend_tokenizer = Tokenizer.from_str(tokenizer_json)


# -- the child ----------------------------------------------------------------------


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
            _Ready(
                device=str(model.device) if model.kind != "sim" else "sim",
                kind=model.kind,
                max_length=model.max_length,
                fingerprint=model.fingerprint,
                tokenizer_json=backend.to_str() if backend is not None else None,
                device_uuid=cuda_uuid(model.device.index or 0) if model.kind == "cuda" else None,
            ),
        )
    )
    prepared: collections.OrderedDict[int, Encoded] = collections.OrderedDict()
    lock = threading.Lock()
    threading.Thread(
        target=_serve_tokenize, args=(model, tok, prepared, lock), name="tokenizer", daemon=True
    ).start()
    _serve_forward(model, fwd, prepared, lock)


def _error(exc: BaseException) -> tuple[str, str, str]:
    return ("err", type(exc).__name__, str(exc))


def _serve_tokenize(
    model: Any, conn: Connection, prepared: collections.OrderedDict[int, Encoded], lock: Any
) -> None:
    while True:
        try:
            _op, handle, texts, pad_to, rows = conn.recv()
        except (EOFError, OSError):
            return
        try:
            enc = model.tokenize(texts, pad_to=pad_to, rows=rows)
        except Exception as exc:
            conn.send(_error(exc))
            continue
        with lock:
            prepared[handle] = enc
            while len(prepared) > _PREPARED:
                prepared.popitem(last=False)
        conn.send(("ok", enc.n_tokens, enc.padded_tokens))


def _serve_forward(
    model: Any, conn: Connection, prepared: collections.OrderedDict[int, Encoded], lock: Any
) -> None:
    while True:
        try:
            _op, handle = conn.recv()
        except (EOFError, OSError):
            return
        with lock:
            enc = prepared.pop(handle, None)
        if enc is None:
            conn.send(("err", "InferenceError", f"batch {handle} is not prepared here"))
            continue
        try:
            t0 = time.perf_counter()
            before = model.timing.totals()[2]
            preds = model.forward(enc)
            wall = time.perf_counter() - t0
            after = model.timing.totals()[2]
        except Exception as exc:
            conn.send(_error(exc))
            continue
        wait = None if after is None else after - (before or 0.0)
        if preds and preds[0].embedding is not None:
            body: Any = ("embed", b"".join(p.embedding for p in preds), len(preds))
        else:
            body = ("labels", [(p.label, p.score) for p in preds])
        conn.send(("ok", body, wall, wait))


# -- the worker's side --------------------------------------------------------------


class RemoteModel:
    """A model whose tokenizer and network run in a child process (see the module)."""

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings
        self.name = settings.display_name
        self.version = settings.version
        self.task = settings.task
        self.timing = ForwardTiming()
        self.restarts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._tok: Connection | None = None
        self._fwd: Connection | None = None
        self._tok_lock = threading.Lock()
        self._fwd_lock = threading.Lock()
        self._life = threading.Lock()  # starting, killing, restarting
        self._handles = iter(range(1, 2**62))
        self._starts: collections.deque[float] = collections.deque()
        self._closed = False
        ready = self._spawn()
        self.device = ready.device
        self.kind = ready.kind
        self.max_length = ready.max_length
        self.fingerprint = ready.fingerprint
        self.device_uuid = ready.device_uuid
        tokenizer = _Backend(ready.tokenizer_json) if ready.tokenizer_json else None
        self.keys = InputKeys(ready.fingerprint, tokenizer)

    @classmethod
    def start(cls, settings: ModelSettings) -> RemoteModel:
        """Start the model process and wait until it has loaded the model."""
        return cls(settings)

    @property
    def model_id(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def accelerated(self) -> bool:
        return self.kind in ("cuda", "sim")

    @property
    def pid(self) -> int | None:
        """The model process's pid while one runs."""
        return None if self._proc is None else self._proc.pid

    def __repr__(self) -> str:
        return f"RemoteModel({self.model_id!r}, device={self.device!r}, pid={self.pid})"

    # -- life ----------------------------------------------------------------

    def _spawn(self) -> _Ready:
        """Start a child (``python -m pipeline.inference.process``, which imports
        neither the worker nor its ``__main__``) and wait for it to be ready."""
        pairs = [socket.socketpair() for _ in range(2)]
        fds = [child.fileno() for _parent, child in pairs]
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.inference.process", *map(str, fds)],
            pass_fds=fds,
            stdin=subprocess.DEVNULL,
        )
        tok_parent, fwd_parent = (Connection(parent.detach()) for parent, _child in pairs)
        for _parent, child in pairs:
            child.close()
        self._starts.append(time.monotonic())
        deadline = time.monotonic() + START_TIMEOUT_S
        message: Any = None
        try:
            fwd_parent.send(self.settings)
            while time.monotonic() < deadline:
                if fwd_parent.poll(0.2):
                    message = fwd_parent.recv()
                    break
                if proc.poll() is not None:
                    break
        except (EOFError, OSError):
            message = None
        if not (isinstance(message, tuple) and message and message[0] == "ready"):
            with contextlib.suppress(Exception):
                proc.kill()
            proc.wait(5)
            for conn in (tok_parent, fwd_parent):
                conn.close()
            if isinstance(message, tuple) and message and message[0] == "error":
                raise ConfigurationError(str(message[1]))
            raise ConfigurationError(
                f"the model process exited (code {proc.returncode}) before it was ready; "
                "its error is in the worker's log above"
            )
        self._proc, self._tok, self._fwd = proc, tok_parent, fwd_parent
        log.info("model process %d ready (%s)", proc.pid, message[1].device)
        ready: _Ready = message[1]
        return ready

    def _kill(self, why: str) -> None:
        """Called with ``_life`` held: end the child, whatever its state."""
        proc, self._proc = self._proc, None
        for conn in (self._tok, self._fwd):
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
        self._tok = self._fwd = None
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            log.error("model process %d ended (exit code %s): %s", proc.pid, proc.returncode, why)

    def _ensure(self) -> None:
        """A running child, started again if it died; raises when restarts are spent."""
        with self._life:
            if self._closed:
                raise ModelProcessError("the model process was closed")
            if self._proc is not None and self._proc.poll() is None:
                return
            self._kill("found dead")
            now = time.monotonic()
            while self._starts and now - self._starts[0] > RESTART_WINDOW_S:
                self._starts.popleft()
            if len(self._starts) > self.settings.process_restarts:
                raise ModelProcessError(
                    f"the model process died {len(self._starts)} times within "
                    f"{RESTART_WINDOW_S:.0f} s; not restarted before "
                    f"{self._starts[0] + RESTART_WINDOW_S - now:.0f} s from now "
                    "(PIPELINE_MODEL_PROCESS_RESTARTS)"
                )
            self.restarts += 1
            log.warning("restarting the model process (restart %d)", self.restarts)
            try:
                self._spawn()
            except ConfigurationError as exc:
                raise ModelProcessError(f"the model process could not restart: {exc}") from exc

    def _call(self, which: str, message: tuple[Any, ...]) -> Any:
        self._ensure()
        conn = self._tok if which == "tok" else self._fwd
        proc = self._proc
        try:
            if conn is None:
                raise EOFError
            conn.send(message)
            if not conn.poll(self.settings.process_timeout_s):
                raise TimeoutError
            reply = conn.recv()
        except (EOFError, OSError, TimeoutError) as exc:
            hung = isinstance(exc, TimeoutError)
            why = (
                f"no answer within {self.settings.process_timeout_s:.0f} s "
                "(PIPELINE_MODEL_PROCESS_TIMEOUT_S)"
                if hung
                else "its pipe closed"
            )
            with self._life:
                if self._proc is proc:
                    self._kill(why)
            raise ModelProcessError(f"the model process failed a call: {why}") from exc
        if reply[0] == "err":
            raise InferenceError(f"{reply[1]}: {reply[2]}")
        return reply

    def close(self, timeout: float = 10.0) -> None:
        """Stop the child and wait for it (killed past ``timeout``). Idempotent."""
        with self._life:
            self._closed = True
            proc = self._proc
            for conn in (self._tok, self._fwd):
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
            if proc is not None:
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
            self._proc = None

    # -- the model's calls ---------------------------------------------------------

    def tokenize(
        self, texts: list[str], *, pad_to: int | None = None, rows: int | None = None
    ) -> Encoded:
        """Tokenize in the child, which keeps the tensors for :meth:`forward`."""
        handle = next(self._handles)
        with self._tok_lock:
            _ok, n_tokens, padded = self._call("tok", ("tok", handle, list(texts), pad_to, rows))
        return Encoded(list(texts), {}, n_tokens, padded, handle=handle)

    def forward(self, enc: Encoded) -> list[Prediction]:
        """Compute a batch :meth:`tokenize` prepared; one prediction per text."""
        with self._fwd_lock:
            _ok, body, wall, wait = self._call("fwd", ("fwd", enc.handle))
        self.timing.add(wall, wait)
        if body[0] == "embed":
            data, n = body[1], body[2]
            width = len(data) // n if n else 0
            return [Prediction(embedding=data[i * width : (i + 1) * width]) for i in range(n)]
        return [Prediction(label=label, score=score) for label, score in body[1]]

    def predict(self, texts: list[str]) -> list[Prediction]:
        """``forward(tokenize(texts))``."""
        return self.forward(self.tokenize(texts))

    def count_tokens(self, text: str) -> int:
        """Tokens the model will see for ``text`` (asked of the child)."""
        return self.tokenize([text]).n_tokens


if __name__ == "__main__":  # the model process: python -m pipeline.inference.process TOK FWD
    # Run the module's own copy, not this __main__ one: what it pickles must name
    # pipeline.inference.process, where the worker looks for it.
    from pipeline.inference.process import _child_main as main

    main(*(Connection(int(fd)) for fd in sys.argv[1:3]))
