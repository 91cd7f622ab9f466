"""The inference engine: two dedicated threads, the only places the model runs.

A tokenizer stage (thread ``inference-tokenizer``) prepares the next batch,
tokenised, padded and, on CUDA, already copied to the device, while the
inference thread (``inference``) computes the current one; between them
waits at most one prepared batch. Only the inference thread calls
``forward``, and :meth:`InferenceEngine.busy_fraction` counts only its time.

Promises:

- ``await engine.run(texts)`` returns exactly one :class:`Outcome` per text,
  in order: ok (a prediction) or failed (an :class:`InferenceError`). One bad
  text never fails its neighbours: when a batch raises, it is split in halves
  and each half retried, recursively, until the failing texts stand alone.
- The event loop never blocks: submitting waits for room in a bounded queue
  with an awaitable, and results come back through ``call_soon_threadsafe``.
- ``stop()`` finishes (or fails, with :class:`EngineStopped`) every accepted
  job and joins both threads; no caller is left waiting forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol

from pipeline.errors import InferenceError
from pipeline.inference._sync import BusyTracker, Slots
from pipeline.inference.outcome import BatchOutcome, EngineStats, EngineStopped, Outcome
from pipeline.inference.types import Encoded, Prediction

__all__ = [
    "BatchOutcome",
    "EngineStats",
    "EngineStopped",
    "InferenceEngine",
    "Outcome",
    "Predictor",
]


class Predictor(Protocol):
    """What the engine needs of a model (:class:`~pipeline.inference.model.Model` fits)."""

    def tokenize(
        self, texts: list[str], *, pad_to: int | None = None, rows: int | None = None
    ) -> Encoded: ...

    def forward(self, enc: Encoded) -> list[Prediction]: ...


@dataclasses.dataclass
class _Job:
    texts: list[str]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[BatchOutcome]
    pad_to: int | None = None
    rows: int | None = None
    # Set by the tokenizer stage: the prepared batch, or why preparing it failed.
    enc: Encoded | None = None
    error: Exception | None = None
    tokenize_ms: float = 0.0


@dataclasses.dataclass
class _Tally:
    n_tokens: int = 0
    padded_tokens: int = 0
    tokenize_ms: float = 0.0
    inference_ms: float = 0.0
    calls: int = 0
    idle_before_ms: float | None = None


def _as_inference_error(exc: Exception) -> InferenceError:
    if isinstance(exc, InferenceError):
        return exc
    try:
        raise InferenceError(f"{type(exc).__name__}: {exc}") from exc
    except InferenceError as wrapped:
        return wrapped


def _settle(
    job: _Job, result: BatchOutcome | None = None, error: BaseException | None = None
) -> None:
    """Complete ``job.future`` from any thread; a closed loop or a cancelled caller is ignored."""

    def settle() -> None:
        if job.future.done():
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            assert result is not None
            job.future.set_result(result)

    with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
        job.loop.call_soon_threadsafe(settle)


_STOP = object()

#: Weight of the newest batch in :meth:`InferenceEngine.tokenize_ms`.
_TOKENIZE_ALPHA = 0.2


class InferenceEngine:
    """Runs a model on two non-daemon threads: ``inference-tokenizer``, ``inference``.

    ``queue_size`` bounds the jobs waiting for the tokenizer stage; beyond
    them one job may be in tokenisation, one prepared and one running.
    ``run`` awaits room when it is full. ``busy_window_s`` is the sliding
    window of :meth:`busy_fraction`; ``clock`` (seconds) is injectable.
    """

    def __init__(
        self,
        model: Predictor,
        *,
        queue_size: int = 4,
        busy_window_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if queue_size < 1:
            raise ValueError("queue_size must be at least 1")
        self.model = model
        self._slots = Slots(queue_size)
        self._queue: queue.SimpleQueue[_Job | object] = queue.SimpleQueue()
        self._prepared: queue.Queue[_Job | object] = queue.Queue(maxsize=1)
        self._lock = threading.Lock()
        self._accepting = False
        self._abandon = False  # stop(drain=False): fail what has not started running
        self._thread: threading.Thread | None = None
        self._tokenizer: threading.Thread | None = None
        self._busy = BusyTracker(busy_window_s, clock)
        self._device_end: float | None = None  # perf_counter: the last forward's end
        self._batches = self._items = self._failures = self._calls = 0
        self._tokenize_ms: float | None = None
        # A model process tokenizes a batch queued ahead after handing it back; its
        # counts and tokenising time come with the forward (process.py).
        self._counted_later = hasattr(model, "tokenized")

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Start the engine's threads. Starting twice, or after ``stop``, is an error."""
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("the inference engine was already started")
            self._thread = threading.Thread(target=self._serve, name="inference", daemon=False)
            self._tokenizer = threading.Thread(
                target=self._prepare, name="inference-tokenizer", daemon=False
            )
            self._accepting = True
            self._thread.start()
            self._tokenizer.start()

    def stop(self, timeout: float | None = None, *, drain: bool = True) -> bool:
        """Stop accepting work, settle every accepted job, join both threads.

        ``drain=True`` runs queued jobs first; ``drain=False`` fails them with
        :class:`EngineStopped`, prepared ones included (the running batch
        still finishes). Returns whether the threads ended within ``timeout``
        seconds. Idempotent.
        """
        with self._lock:
            was_accepting, self._accepting = self._accepting, False
            if was_accepting:
                if not drain:
                    self._abandon = True
                    self._fail_queued()
                self._queue.put(_STOP)
        self._slots.release()  # wake one waiter; each woken waiter wakes the next
        threads = [t for t in (self._tokenizer, self._thread) if t is not None]
        if threading.current_thread() not in threads:
            deadline = None if timeout is None else time.monotonic() + timeout
            for thread in threads:
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        stopped = not any(t.is_alive() for t in threads)
        close = getattr(self.model, "close", None)  # a model process (process.py)
        if stopped and callable(close):
            close()
        return stopped

    # -- submitting --------------------------------------------------------

    async def run(
        self, texts: list[str], *, pad_to: int | None = None, rows: int | None = None
    ) -> BatchOutcome:
        """Compute ``texts`` as one batch on the engine's threads; one outcome per text.

        ``pad_to`` and ``rows`` are the batch's bucketed shape, handed to the
        model's ``tokenize`` (whose padding setting decides whether to use
        them). Raises :class:`EngineStopped` if the engine is not running.
        """
        if not texts:
            return BatchOutcome(outcomes=[], batch_size=0)
        if not self._accepting:
            raise EngineStopped("the inference engine is not running")
        await self._slots.acquire()
        loop = asyncio.get_running_loop()
        job = _Job(list(texts), loop, loop.create_future(), pad_to, rows)
        with self._lock:
            accepted = self._accepting
            if accepted:
                self._queue.put(job)
        if not accepted:
            self._slots.release()
            raise EngineStopped("the inference engine was stopped")
        return await job.future

    # -- observing ---------------------------------------------------------

    def busy_fraction(self) -> float:
        """Share of the last ``busy_window_s`` seconds the inference thread spent computing."""
        return self._busy.fraction()

    def tokenize_ms(self) -> float | None:
        """Moving average of a batch's tokenising time (the model process's own, where
        it tokenizes); ``None`` before the first."""
        return self._tokenize_ms

    @property
    def overlaps(self) -> bool:
        """Whether preparing the next batch while one runs pays: on a GPU, which computes
        while the CPU tokenises and copies. On a CPU both stages share the cores (no gain
        beyond noise, README "Pipelining and threads"), and a realtime request arriving
        meanwhile would wait behind the batch formed early as well as the running one."""
        return bool(getattr(self.model, "accelerated", False))

    def stats(self) -> EngineStats:
        """Batches, items, failed items and model calls so far."""
        return EngineStats(self._batches, self._items, self._failures, self._calls)

    # -- the engine's threads ----------------------------------------------

    def _fail_queued(self) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(job, _Job):
                self._slots.release()
                _settle(job, error=EngineStopped("the inference engine was stopped"))

    def _prepare(self) -> None:
        """The tokenizer stage: tokenise each job, then hand it over (waits while one waits)."""
        while True:
            job = self._queue.get()
            if not isinstance(job, _Job):
                self._prepared.put(_STOP)
                return
            self._slots.release()
            if job.future.cancelled():
                continue
            if self._abandon:
                _settle(job, error=EngineStopped("the inference engine was stopped"))
                continue
            t0 = time.perf_counter()
            try:
                job.enc = self.model.tokenize(job.texts, pad_to=job.pad_to, rows=job.rows)
            except Exception as exc:  # the inference thread bisects to find the culprit
                job.error = exc
            job.tokenize_ms = (time.perf_counter() - t0) * 1000.0
            if not self._counted_later:
                self._note_tokenize(job.tokenize_ms)
            self._prepared.put(job)

    def _note_tokenize(self, ms: float) -> None:
        last = self._tokenize_ms
        self._tokenize_ms = ms if last is None else last + _TOKENIZE_ALPHA * (ms - last)

    def _serve(self) -> None:
        while True:
            job = self._prepared.get()
            if not isinstance(job, _Job):
                return
            if job.future.cancelled():
                continue
            if self._abandon:
                _settle(job, error=EngineStopped("the inference engine was stopped"))
                continue
            self._busy.begin()
            try:
                outcome = self._compute(job)
            except Exception as exc:  # a bug here must not leave the caller waiting
                _settle(job, error=_as_inference_error(exc))
                continue
            finally:
                self._busy.end()
            _settle(job, result=outcome)

    def _compute(self, job: _Job) -> BatchOutcome:
        texts = job.texts
        # A model process's tokenising time comes with each forward (_call); what the
        # tokenizer stage measured then is the send.
        tally = _Tally(tokenize_ms=0.0 if self._counted_later else job.tokenize_ms)
        outcomes = self._bisect(texts, tally, job.pad_to, job)
        result = BatchOutcome(
            outcomes=outcomes,
            batch_size=len(texts),
            n_tokens=tally.n_tokens,
            padded_tokens=tally.padded_tokens,
            tokenize_ms=tally.tokenize_ms,
            inference_ms=tally.inference_ms,
            model_calls=tally.calls,
            idle_before_ms=tally.idle_before_ms,
        )
        self._batches += 1
        self._items += len(texts)
        self._failures += result.failures
        self._calls += tally.calls
        return result

    def _bisect(
        self, texts: list[str], tally: _Tally, pad_to: int | None, prepared: _Job | None = None
    ) -> list[Outcome]:
        try:
            predictions = self._call(texts, tally, pad_to, prepared)
        except Exception as exc:
            if len(texts) == 1:
                return [Outcome(error=_as_inference_error(exc))]
            mid = len(texts) // 2
            return self._bisect(texts[:mid], tally, pad_to) + self._bisect(
                texts[mid:], tally, pad_to
            )
        return [Outcome(prediction=p) for p in predictions]

    def _call(
        self, texts: list[str], tally: _Tally, pad_to: int | None, prepared: _Job | None
    ) -> list[Prediction]:
        """One model call; the whole batch comes prepared, bisected halves are tokenised here."""
        tally.calls += 1
        if prepared is not None:
            if prepared.error is not None:
                raise prepared.error
            assert prepared.enc is not None
            enc = prepared.enc
        else:
            t0 = time.perf_counter()
            enc = self.model.tokenize(texts, pad_to=pad_to)
            if not self._counted_later:  # else the send's time: the forward brings its own
                tally.tokenize_ms += (time.perf_counter() - t0) * 1000.0
        t1 = time.perf_counter()
        try:
            predictions = self.model.forward(enc)
        finally:
            # A model process runs batches queued ahead in order: the time this one
            # waited there behind the one before it is that one's, not its own.
            t2 = time.perf_counter()
            queued_s = getattr(self.model, "queued_s", 0.0)
            tally.inference_ms += max(0.0, t2 - t1 - queued_s) * 1000.0
            # When the device ran it (a model process says; else this call's span).
            began, ended = getattr(self.model, "device_span", None) or (t1 + queued_s, t2)
            if tally.calls == 1 and self._device_end is not None:
                tally.idle_before_ms = max(0.0, began - self._device_end) * 1000.0
            self._device_end = ended
        counted = getattr(self.model, "tokenized", None)
        if counted is None:
            tally.n_tokens += enc.n_tokens
            tally.padded_tokens += enc.padded_tokens
        else:
            tally.n_tokens += counted[0]
            tally.padded_tokens += counted[1]
            tally.tokenize_ms += counted[2] * 1000.0
            self._note_tokenize(counted[2] * 1000.0)
        if len(predictions) != len(texts):
            raise InferenceError(f"model returned {len(predictions)} results for {len(texts)}")
        return predictions
