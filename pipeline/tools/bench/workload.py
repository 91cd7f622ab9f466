"""The benchmark's workload: pure and seeded, so every mode sees the same requests.

A :class:`Workload` is a list of :class:`BenchRequest` (text, lane, send
offset). Promises, for a given :class:`WorkloadSpec`:

- the same spec (seed included) gives the same list, byte for byte;
- text lengths follow ``length_mix``: mostly short queries, a tail of long
  texts, built from :data:`WORDS`;
- lanes follow ``lane_mix`` (default 10 % realtime, 60 % standard, 30 % bulk);
- a share ``dup_rate`` of the requests repeats an earlier text, chosen from a
  hot set of the first ``hot_set`` distinct texts with Zipf weights (rank r
  weighs 1/r^``zipf_s``), so a few texts are very hot; every other text is
  new (never seen before in the list);
- offsets are open-loop Poisson arrivals at ``rate`` per second, or all 0
  (saturation: send as fast as possible) when ``rate`` is 0.

:func:`backlog` joins two such lists: a bulk backlog sent at once and a
realtime stream across it.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import random
from collections.abc import Sequence

from pipeline.settings import LANES

__all__ = ["WORDS", "BenchRequest", "WorkloadSpec", "backlog", "generate"]

#: The vocabulary texts are built from (common English words: real tokenizer pieces).
_VOCABULARY = """
    the of and to in is you that it he was for on are as with his they at be this have
    from or one had by word but not what all were we when your can said there use an each
    which she do how their if will up other about out many then them these so some her
    would make like him into time has look two more write go see number no way could people
    my than first water been call who oil its now find long down day did get come made may
    part order account password reset card payment refund delivery shipping invoice price
    plan premium basic upgrade cancel subscription battery phone screen charge network
    signal login error update install app store review great fast slow broken return
    warranty support agent question answer help urgent report revenue region quarter growth
    contract renewal customer product service quality issue problem request status tracking
    package address change email message notification setting privacy security fraud
    transaction bank transfer balance statement loan credit debit limit fee interest rate
    travel flight hotel booking seat upgrade baggage delay airport ticket train city
    weather forecast rain sunny cold warm weekend morning evening night today tomorrow
"""
WORDS: tuple[str, ...] = tuple(_VOCABULARY.split())


@dataclasses.dataclass(frozen=True)
class BenchRequest:
    """One request of the workload: what to send, where, and when (ms after the start)."""

    index: int
    text: str
    lane: str
    offset_ms: float
    duplicate: bool


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    """What to generate. ``length_mix``: (weight, min words, max words) per class."""

    n: int
    seed: int = 0
    rate: float = 0.0
    dup_rate: float = 0.2
    lane_mix: tuple[float, float, float] = (0.1, 0.6, 0.3)
    length_mix: tuple[tuple[float, int, int], ...] = ((0.75, 3, 12), (0.2, 13, 40), (0.05, 41, 160))
    hot_set: int = 50
    zipf_s: float = 1.1

    def __post_init__(self) -> None:
        if self.n < 0 or self.rate < 0 or not 0.0 <= self.dup_rate <= 1.0:
            raise ValueError("need n >= 0, rate >= 0 and 0 <= dup_rate <= 1")
        if len(self.lane_mix) != len(LANES) or min(self.lane_mix) < 0 or sum(self.lane_mix) <= 0:
            raise ValueError(f"lane_mix needs {len(LANES)} non-negative weights")
        if self.hot_set < 1 or not self.length_mix:
            raise ValueError("need hot_set >= 1 and at least one length class")


def _cumulative(weights: Sequence[float]) -> list[float]:
    return list(itertools.accumulate(weights))


def _pick(rng: random.Random, cumulative: Sequence[float]) -> int:
    return min(bisect.bisect_right(cumulative, rng.random() * cumulative[-1]), len(cumulative) - 1)


def generate(spec: WorkloadSpec) -> list[BenchRequest]:
    """The workload for ``spec`` (see the module's promise)."""
    rng = random.Random(spec.seed)
    lanes = _cumulative(spec.lane_mix)
    lengths = _cumulative([w for w, _, _ in spec.length_mix])
    zipf = _cumulative([1.0 / (r**spec.zipf_s) for r in range(1, spec.hot_set + 1)])
    seen: set[str] = set()
    hot: list[str] = []
    out: list[BenchRequest] = []
    clock = 0.0
    for i in range(spec.n):
        if spec.rate > 0 and i > 0:
            clock += rng.expovariate(spec.rate) * 1000.0
        lane = LANES[_pick(rng, lanes)]
        duplicate = bool(hot) and rng.random() < spec.dup_rate
        if duplicate:
            rank = _pick(rng, zipf[: len(hot)])
            text = hot[rank]
        else:
            _, lo, hi = spec.length_mix[_pick(rng, lengths)]
            while True:
                text = " ".join(rng.choices(WORDS, k=rng.randint(lo, hi)))
                if text not in seen:
                    break
            seen.add(text)
            if len(hot) < spec.hot_set:
                hot.append(text)
        out.append(BenchRequest(i, text, lane, clock, duplicate))
    return out


def backlog(
    bulk: int, *, rate: float, realtime: int, seed: int, dup_rate: float = 0.2
) -> list[BenchRequest]:
    """``bulk`` bulk requests at offset 0, then ``realtime`` realtime requests open
    loop at ``rate`` per second from offset 0 (so they arrive while the bulk
    drains, if it takes that long), as one list in send order.

    Promises: the bulk part is ``generate`` of a bulk-only spec (``seed``,
    ``dup_rate``); the realtime part is ``generate`` of a realtime-only spec
    (``seed + 1``, no repeats: each realtime request is computed, not answered
    from the dedupe levels); indices run 0..len-1 in that order; offsets never
    decrease.
    """
    if rate <= 0:
        raise ValueError("the realtime stream needs rate > 0")
    heap = generate(WorkloadSpec(n=bulk, seed=seed, dup_rate=dup_rate, lane_mix=(0, 0, 1)))
    stream = generate(
        WorkloadSpec(n=realtime, seed=seed + 1, rate=rate, dup_rate=0.0, lane_mix=(1, 0, 0))
    )
    return heap + [dataclasses.replace(r, index=bulk + r.index) for r in stream]
