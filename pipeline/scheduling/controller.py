"""The batch-size controller: a token budget steered by measured latency and utilisation.

Pure: it sees numbers the caller measured, never a clock or a device.

:class:`LatencyModel` predicts a batch's run time as ``overhead + cost x
padded tokens``, fitted online by exponentially weighted least squares (the
newest batch weighs ``latency_alpha``); until batches of different sizes have
been seen it keeps the per-token cost (prior or last fitted) and fits the
overhead alone. The worker calibrates it at start-up (``pipeline.scheduling.calibrate``).

:class:`Controller` owns the budget (padded tokens per batch). A batch is
*slow* when it ran longer than ``latency_threshold`` x the realtime deadline
(``slo_ms``). Policies:

- ``seed`` (the seed article's): ``slow_batches`` consecutive slow batches →
  budget x ``shrink_factor``; utilisation under ``low_utilisation`` →
  budget x ``grow_factor``.
- ``aimd``: one slow batch → budget x ``aimd_decrease``; utilisation under
  ``low_utilisation`` (or unknown) → budget + ``aimd_step``.
- ``fixed``: the budget never moves (a baseline; the latency model still learns).

Two guards keep growth from ratcheting or oscillating: the budget grows only
after a batch the budget actually cut (``saturated``), and only while the
latency model predicts that a batch of the grown budget is still not slow.
Every change stays within ``token_budget_min``..``token_budget_max``.

A budget that slow batches shrank below its starting value (``token_budget``)
grows back towards it after ``recover_batches`` saturated batches in a row that
were not slow, whatever the utilisation. Without that a CPU, whose inference
thread is busy whenever there is a backlog, never grows back: in a measured
open-loop run at 80 % load, contention made a few batches slow and the budget
went 614 → 251 tokens for good, the smaller batches' overhead cut throughput
below the offered rate, and the queues grew for the rest of the run.
"""

from __future__ import annotations

from pipeline.settings import SchedulerSettings

__all__ = ["Controller", "LatencyModel"]


class LatencyModel:
    """Predicts a batch's run time (ms) from its padded tokens."""

    def __init__(self, *, overhead_ms: float, ms_per_token: float, alpha: float) -> None:
        self.overhead_ms = overhead_ms
        self.ms_per_token = ms_per_token
        self.alpha = alpha
        self.samples = 0
        self._mx = self._my = self._mxx = self._mxy = 0.0

    def predict_ms(self, padded_tokens: int) -> float:
        """Expected run time of a batch of ``padded_tokens`` (batch rows x sequence length)."""
        return self.overhead_ms + self.ms_per_token * max(padded_tokens, 0)

    def tokens_within(self, ms: float) -> int:
        """The most padded tokens a batch may hold to run within ``ms`` (0 if none fit)."""
        if ms <= self.overhead_ms:
            return 0
        return int((ms - self.overhead_ms) / max(self.ms_per_token, 1e-9))

    def observe(self, padded_tokens: int, latency_ms: float) -> None:
        """Fold one measured batch into the model."""
        x, y = float(max(padded_tokens, 1)), max(latency_ms, 0.0)
        if self.samples == 0:
            self._mx, self._my, self._mxx, self._mxy = x, y, x * x, x * y
        else:
            a = self.alpha
            self._mx += a * (x - self._mx)
            self._my += a * (y - self._my)
            self._mxx += a * (x * x - self._mxx)
            self._mxy += a * (x * y - self._mxy)
        self.samples += 1
        var = self._mxx - self._mx * self._mx
        if self.samples >= 3 and var > (0.1 * self._mx) ** 2:
            slope = (self._mxy - self._mx * self._my) / var
            intercept = self._my - slope * self._mx
            if slope > 0 and intercept >= 0:
                self.ms_per_token, self.overhead_ms = slope, intercept
                return
        # Too little spread in batch sizes to separate the two terms. Batches of one
        # size cannot show the cost per token, so it is kept and the overhead fitted
        # (attributing a small batch's time to overhead would predict a big batch
        # as cheap as a small one); batches cheaper than that cost alone lower it.
        fixed = self.ms_per_token * self._mx
        if self._my >= fixed:
            self.overhead_ms = self._my - fixed
        else:
            self.overhead_ms = 0.0
            self.ms_per_token = self._my / self._mx


class Controller:
    """Owns the token budget and the latency model (see the module's promise)."""

    def __init__(self, settings: SchedulerSettings, *, slo_ms: int) -> None:
        self.settings = settings
        self.slo_ms = slo_ms
        self.threshold_ms = settings.latency_threshold * slo_ms
        self.model = LatencyModel(
            overhead_ms=settings.latency_overhead_ms,
            ms_per_token=settings.latency_ms_per_token,
            alpha=settings.latency_alpha,
        )
        self.budget = settings.token_budget
        self.slow_streak = 0
        self.fast_streak = 0  # saturated batches in a row that were not slow
        self.grows = 0
        self.shrinks = 0
        self.slow = 0
        self.observed = 0
        self.last_latency_ms = 0.0
        self.last_utilisation: float | None = None

    def predict_ms(self, padded_tokens: int) -> float:
        return self.model.predict_ms(padded_tokens)

    def tokens_within(self, ms: float) -> int:
        return self.model.tokens_within(ms)

    def observe(
        self,
        *,
        padded_tokens: int,
        latency_ms: float,
        utilisation: float | None,
        saturated: bool,
    ) -> int:
        """Fold in one finished batch; returns the (possibly changed) budget.

        ``utilisation`` is the device's busy fraction (0..1) over the batch,
        ``None`` when unknown; ``saturated`` says the budget, not a lack of
        work, limited the batch.
        """
        s = self.settings
        self.model.observe(padded_tokens, latency_ms)
        self.observed += 1
        self.last_latency_ms = latency_ms
        self.last_utilisation = utilisation
        slow = latency_ms > self.threshold_ms
        self.slow += slow
        self.slow_streak = self.slow_streak + 1 if slow else 0
        self.fast_streak = self.fast_streak + 1 if saturated and not slow else 0
        idle = utilisation is not None and utilisation < s.low_utilisation
        if s.policy == "fixed":
            return self.budget
        if s.policy == "aimd":
            if slow:
                return self._set(self.budget * s.aimd_decrease)
            if saturated:
                return self._grow(self.budget + s.aimd_step, idle=idle or utilisation is None)
            return self.budget
        if self.slow_streak >= s.slow_batches:
            self.slow_streak = 0
            return self._set(self.budget * s.shrink_factor)
        if not slow and saturated:
            return self._grow(self.budget * s.grow_factor, idle=idle)
        return self.budget

    def snapshot(self) -> dict[str, float]:
        """Gauges and counters of the controller, for metrics."""
        return {
            "budget": float(self.budget),
            "fast_streak": float(self.fast_streak),
            "budget_grows": float(self.grows),
            "budget_shrinks": float(self.shrinks),
            "slow_batches": float(self.slow),
            "slow_streak": float(self.slow_streak),
            "threshold_ms": self.threshold_ms,
            "latency_ms_last": self.last_latency_ms,
            "latency_overhead_ms": self.model.overhead_ms,
            "latency_ms_per_token": self.model.ms_per_token,
            "utilisation_last": -1.0 if self.last_utilisation is None else self.last_utilisation,
        }

    def _grow(self, target: float, *, idle: bool) -> int:
        """Grow to ``target`` when idle; else only back towards the starting budget
        after ``recover_batches`` fast saturated batches (see the module's promise)."""
        if not idle:
            start = self.settings.token_budget
            if self.budget >= start or self.fast_streak < self.settings.recover_batches:
                return self.budget
            target = min(target, start)
        # Never step into a budget the latency model already predicts to be slow:
        # that step would come straight back after the next slow streak.
        if self.model.predict_ms(int(target)) > self.threshold_ms:
            return self.budget
        self.fast_streak = 0
        return self._set(target)

    def _set(self, target: float) -> int:
        s = self.settings
        new = int(min(max(round(target), s.token_budget_min), s.token_budget_max))
        if new > self.budget:
            self.grows += 1
        elif new < self.budget:
            self.shrinks += 1
        self.budget = new
        return new
