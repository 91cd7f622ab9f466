"""The inference engine: one dedicated thread, the only place the model runs.

Promises:

- ``await engine.run(texts)`` returns exactly one :class:`Outcome` per text,
  in order: ok (a prediction) or failed (an :class:`InferenceError`). One bad
  text never fails its neighbours: when a batch raises, it is split in halves
  and each half retried, recursively, until the failing texts stand alone.
- The event loop never blocks: submitting waits for room in a bounded queue
  with an awaitable, and results come back through ``call_soon_threadsafe``.
- ``stop()`` finishes (or fails, with :class:`EngineStopped`) every accepted
  job and joins the thread; no caller is left waiting forever.
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
from pipeline.inference.model import Encoded, Prediction
from pipeline.inference.outcome import BatchOutcome, EngineStats, EngineStopped, Outcome

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

    def tokenize(self, texts: list[str]) -> Encoded: ...

    def forward(self, enc: Encoded) -> list[Prediction]: ...


@dataclasses.dataclass
class _Job:
    texts: list[str]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[BatchOutcome]


@dataclasses.dataclass
class _Tally:
    n_tokens: int = 0
    padded_tokens: int = 0
    tokenize_ms: float = 0.0
    inference_ms: float = 0.0
    calls: int = 0


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


class InferenceEngine:
    """Runs a model on its own non-daemon thread named ``inference``.

    ``queue_size`` bounds the jobs waiting for the thread (the running one not
    counted); ``run`` awaits room when it is full. ``busy_window_s`` is the
    sliding window of :meth:`busy_fraction`; ``clock`` (seconds) is injectable.
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
        self._lock = threading.Lock()
        self._accepting = False
        self._thread: threading.Thread | None = None
        self._busy = BusyTracker(busy_window_s, clock)
        self._batches = self._items = self._failures = self._calls = 0

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Start the engine thread. Starting twice, or after ``stop``, is an error."""
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("the inference engine was already started")
            self._thread = threading.Thread(target=self._serve, name="inference", daemon=False)
            self._accepting = True
            self._thread.start()

    def stop(self, timeout: float | None = None, *, drain: bool = True) -> bool:
        """Stop accepting work, settle every accepted job, join the thread.

        ``drain=True`` runs queued jobs first; ``drain=False`` fails them with
        :class:`EngineStopped` (the running batch still finishes). Returns
        whether the thread ended within ``timeout`` seconds. Idempotent.
        """
        with self._lock:
            was_accepting, self._accepting = self._accepting, False
            if was_accepting:
                if not drain:
                    self._fail_queued()
                self._queue.put(_STOP)
        self._slots.release()  # wake one waiter; each woken waiter wakes the next
        thread = self._thread
        if thread is None:
            return True
        if thread is not threading.current_thread():
            thread.join(timeout)
        return not thread.is_alive()

    @property
    def running(self) -> bool:
        """Whether the engine accepts work."""
        return self._accepting

    @property
    def thread_ident(self) -> int | None:
        """``threading.get_ident()`` of the engine thread, once started."""
        return None if self._thread is None else self._thread.ident

    # -- submitting --------------------------------------------------------

    async def run(self, texts: list[str]) -> BatchOutcome:
        """Compute ``texts`` as one batch on the engine thread; one outcome per text.

        Raises :class:`EngineStopped` if the engine is not running.
        """
        if not texts:
            return BatchOutcome(outcomes=[], batch_size=0)
        if not self._accepting:
            raise EngineStopped("the inference engine is not running")
        await self._slots.acquire()
        loop = asyncio.get_running_loop()
        job = _Job(list(texts), loop, loop.create_future())
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
        """Share of the last ``busy_window_s`` seconds the engine thread spent computing."""
        return self._busy.fraction()

    def stats(self) -> EngineStats:
        """Batches, items, failed items and model calls so far."""
        return EngineStats(self._batches, self._items, self._failures, self._calls)

    # -- the engine thread -------------------------------------------------

    def _fail_queued(self) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(job, _Job):
                self._slots.release()
                _settle(job, error=EngineStopped("the inference engine was stopped"))

    def _serve(self) -> None:
        while True:
            job = self._queue.get()
            if not isinstance(job, _Job):
                return
            self._slots.release()
            if job.future.cancelled():
                continue
            self._busy.begin()
            try:
                outcome = self._compute(job.texts)
            except Exception as exc:  # a bug here must not leave the caller waiting
                _settle(job, error=_as_inference_error(exc))
                continue
            finally:
                self._busy.end()
            _settle(job, result=outcome)

    def _compute(self, texts: list[str]) -> BatchOutcome:
        tally = _Tally()
        outcomes = self._bisect(texts, tally)
        result = BatchOutcome(
            outcomes=outcomes,
            batch_size=len(texts),
            n_tokens=tally.n_tokens,
            padded_tokens=tally.padded_tokens,
            tokenize_ms=tally.tokenize_ms,
            inference_ms=tally.inference_ms,
            model_calls=tally.calls,
        )
        self._batches += 1
        self._items += len(texts)
        self._failures += result.failures
        self._calls += tally.calls
        return result

    def _bisect(self, texts: list[str], tally: _Tally) -> list[Outcome]:
        try:
            predictions = self._call(texts, tally)
        except Exception as exc:
            if len(texts) == 1:
                return [Outcome(error=_as_inference_error(exc))]
            mid = len(texts) // 2
            return self._bisect(texts[:mid], tally) + self._bisect(texts[mid:], tally)
        return [Outcome(prediction=p) for p in predictions]

    def _call(self, texts: list[str], tally: _Tally) -> list[Prediction]:
        tally.calls += 1
        t0 = time.perf_counter()
        enc = self.model.tokenize(texts)
        t1 = time.perf_counter()
        tally.tokenize_ms += (t1 - t0) * 1000.0
        tally.n_tokens += enc.n_tokens
        tally.padded_tokens += enc.padded_tokens
        try:
            predictions = self.model.forward(enc)
        finally:
            tally.inference_ms += (time.perf_counter() - t1) * 1000.0
        if len(predictions) != len(texts):
            raise InferenceError(f"model returned {len(predictions)} results for {len(texts)}")
        return predictions
