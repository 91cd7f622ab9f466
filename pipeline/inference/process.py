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
pipeline.inference.process_child``, so no torch or CUDA state is inherited).
The child tokenizes on one thread (the engine's tokenizer stage asks) and
keeps the prepared tensors; a batch the engine tokenized is queued for its
forward at once, so the child runs forwards back to back on its main thread,
and answers each with float32 bytes when it is done (the engine's inference
thread waits for it by handle). Such a batch is sent and not waited for: its
counts come with its forward's answer, one message each way per batch (each
wait in the worker's threads is a turn at the interpreter lock, which the
busy event loop hands over only every switch interval). The worker
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
from pipeline.inference.process_child import PREPARED, Ready
from pipeline.inference.types import Encoded, ForwardTiming, Prediction
from pipeline.settings import ModelSettings

__all__ = ["RESTART_WINDOW_S", "ModelProcessError", "RemoteModel"]

log = logging.getLogger(__name__)

#: The window over which ``process_restarts`` is counted.
RESTART_WINDOW_S = 600.0
#: How long the child may take to load the model.
START_TIMEOUT_S = 600.0


class ModelProcessError(InferenceError):
    """The model process died, hung, or may not be restarted yet."""


class _Backend:
    """The worker's handle on the tokenizer the child loaded: what
    :class:`~pipeline.codecs.keys.InputKeys` reads (``backend_tokenizer``)."""

    def __init__(self, tokenizer_json: str) -> None:
        from tokenizers import Tokenizer

        self.backend_tokenizer = Tokenizer.from_str(tokenizer_json)


class RemoteModel:
    """A model whose tokenizer and network run in a child process (see the module)."""

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings
        self.name = settings.display_name
        self.version = settings.version
        self.task = settings.task
        self.timing = ForwardTiming()
        #: How long the last forward waited in the child behind batches queued before
        #: it, after it was asked for (the engine does not count it as its own time).
        self.queued_s = 0.0
        #: The last forward's (start, end) in the child, on the host's perf_counter clock.
        self.device_span: tuple[float, float] | None = None
        #: The last forward's batch as the child tokenized it: (real tokens, padded
        #: tokens, seconds tokenising). A batch queued ahead is counted only here.
        self.tokenized: tuple[int, int, float] | None = None
        self.restarts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._tok: Connection | None = None
        self._fwd: Connection | None = None
        self._tok_lock = threading.Lock()
        self._fwd_lock = threading.Lock()
        self._life = threading.Lock()  # starting, killing, restarting
        self._handles = iter(range(1, 2**62))
        self._gen = 0  # children started: a batch tokenized ahead runs in the one it names
        self._ahead: dict[int, int] = {}  # handle -> the child it was queued in
        self._ahead_lock = threading.Lock()
        self._results: collections.OrderedDict[int, tuple[Any, ...]] = collections.OrderedDict()
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

    def _spawn(self) -> Ready:
        """Start a child (``python -m pipeline.inference.process_child``, which imports
        neither the worker nor its ``__main__``) and wait for it to be ready."""
        pairs = [socket.socketpair() for _ in range(2)]
        fds = [child.fileno() for _parent, child in pairs]
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.inference.process_child", *map(str, fds)],
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
        self._gen += 1
        self._results.clear()
        log.info("model process %d ready (%s)", proc.pid, message[1].device)
        ready: Ready = message[1]
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

    def _send(self, message: tuple[Any, ...]) -> int:
        """Send ``message`` to the tokenizer without waiting; which child it went to."""
        return self._exchange(message, answer=False)[1]

    def _call(self, message: tuple[Any, ...]) -> tuple[Any, int]:
        """Send ``message`` to the tokenizer; its answer, and which child gave it."""
        reply, gen = self._exchange(message, answer=True)
        if reply[0] == "err":
            raise InferenceError(f"{reply[1]}: {reply[2]}")
        return reply, gen

    def _exchange(self, message: tuple[Any, ...], *, answer: bool) -> tuple[Any, int]:
        """Send ``message`` to the tokenizer, and with ``answer`` wait for its reply; the
        reply (None without ``answer``) and which child it went to."""
        self._ensure()
        with self._life:  # one child's pipe, process and number, together
            conn, proc, gen = self._tok, self._proc, self._gen
        try:
            if conn is None:
                raise EOFError
            conn.send(message)
            if not answer:
                return None, gen
            if not conn.poll(self.settings.process_timeout_s):
                raise TimeoutError
            return conn.recv(), gen
        except (EOFError, OSError, TimeoutError) as exc:
            raise self._failed(proc, exc) from exc

    def _await(self, handle: int) -> tuple[Any, ...]:
        """The forward of ``handle``'s answer; answers to others that come first are kept
        for their callers (a bisected half asks after the batch queued behind it)."""
        conn, proc = self._fwd, self._proc
        deadline = time.monotonic() + self.settings.process_timeout_s
        try:
            while (reply := self._results.pop(handle, None)) is None:
                if conn is None:
                    raise EOFError
                if not conn.poll(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError
                got = conn.recv()
                self._results[got[1]] = got
                while len(self._results) > 2 * PREPARED:  # their callers are gone
                    self._results.popitem(last=False)
        except (EOFError, OSError, TimeoutError) as exc:
            raise self._failed(proc, exc) from exc
        if reply[0] == "err":
            raise InferenceError(f"{reply[2]}: {reply[3]}")
        return reply

    def _failed(self, proc: subprocess.Popen[bytes] | None, exc: BaseException) -> Exception:
        """A call found the child dead or hung: kill it; the error to raise."""
        why = (
            f"no answer within {self.settings.process_timeout_s:.0f} s "
            "(PIPELINE_MODEL_PROCESS_TIMEOUT_S)"
            if isinstance(exc, TimeoutError)
            else "its pipe closed"
        )
        with self._life:
            if self._proc is proc:
                self._kill(why)
        return ModelProcessError(f"the model process failed a call: {why}")

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
        self,
        texts: list[str],
        *,
        pad_to: int | None = None,
        rows: int | None = None,
        ahead: bool = True,
    ) -> Encoded:
        """Tokenize in the child, which keeps the tensors for :meth:`forward`; ``ahead``:
        and queues the forward at once, behind those already queued (the engine forwards
        what it tokenized, in order), so the device never waits for the worker.

        A batch queued ahead is sent without waiting for the child: its counts here are
        0, and :attr:`tokenized` has them after its :meth:`forward`, which also raises
        what tokenizing it raised. ``ahead=False`` waits and counts (``count_tokens``)."""
        handle = next(self._handles)
        message = ("tok", handle, list(texts), pad_to, rows, ahead)
        with self._tok_lock:
            if ahead:  # counted in the forward's answer: nothing to wait for here
                gen, n_tokens, padded = self._send(message), 0, 0
            else:
                (_ok, n_tokens, padded), gen = self._call(message)
        if ahead:
            with self._ahead_lock:
                self._ahead[handle] = gen
                while len(self._ahead) > 2 * PREPARED:  # tokenized, never forwarded
                    del self._ahead[next(iter(self._ahead))]
        return Encoded(list(texts), {}, n_tokens, padded, handle=handle)

    def forward(self, enc: Encoded) -> list[Prediction]:
        """Compute a batch :meth:`tokenize` prepared; one prediction per text."""
        assert enc.handle is not None
        self.device_span = self.tokenized = None
        asked = time.perf_counter()
        with self._fwd_lock:
            with self._ahead_lock:
                queued_in = self._ahead.pop(enc.handle, None)
            if queued_in is None:  # not queued ahead: ask for it
                self._ensure()
                try:
                    if self._fwd is None:
                        raise EOFError
                    self._fwd.send(("fwd", enc.handle))
                except (EOFError, OSError) as exc:
                    raise self._failed(self._proc, exc) from exc
            elif queued_in != self._gen:
                raise ModelProcessError(
                    "the model process that prepared this batch has ended; prepare it again"
                )
            _ok, _handle, body, wall, wait, started, counts = self._await(enc.handle)
        # perf_counter is the host's monotonic clock, the same in both processes.
        self.queued_s = max(0.0, started - asked)
        self.tokenized = counts
        self.device_span = (started, started + wall)
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
        return self.tokenize([text], ahead=False).n_tokens
