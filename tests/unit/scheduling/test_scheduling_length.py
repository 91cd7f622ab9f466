"""Batches by length under a backlog: the cost rule, crowded overdue and realtime requests,
and the worker's token estimate (pipeline.scheduling.budget, .tokens)."""

from __future__ import annotations

import math
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st
from support.scheduling import Item, drive, item, scheduler

from pipeline.scheduling.budget import DUE, LATE, ON_TIME, Draft, Shapes, assemble
from pipeline.scheduling.lanes import LaneQueues
from pipeline.scheduling.tokens import estimate_tokens

BUCKETS = (8, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128, 192, 256)
SHAPES = Shapes(BUCKETS, 256)


def slow_device(padded: int) -> float:
    """The simulated slow device: 2 ms a batch, 20 µs a padded token."""
    return 2.0 + 0.02 * padded


def queues_of(items: list[Item]) -> LaneQueues[Item]:
    queues: LaneQueues[Item] = LaneQueues(
        ("realtime", "standard", "bulk"), queue_size=4096, resume_fraction=0.5
    )
    for it in items:
        assert queues.offer(it, SHAPES.seq_index(it.tokens))
    return queues


def batch(
    queues: LaneQueues[Item],
    cost_ms: Callable[[int], float],
    *,
    budget: int = 2048,
    level: int = ON_TIME,
    urgent_ms: float = -math.inf,
) -> Draft[Item]:
    """The batch :func:`assemble` forms now, every lower-lane request at ``level``."""
    return assemble(
        queues, SHAPES, budget=budget, max_items=256, realtime_share=0.25,
        urgency={id(e): level for e in queues.all_entries()}, cost_ms=cost_ms,
        urgent_ms=urgent_ms,
    )  # fmt: skip


def ratio(draft: Draft[Item], cost_ms: Callable[[int], float]) -> float:
    """Predicted time per real token of ``draft``."""
    return cost_ms(draft.padded) / draft.real


# -- the cost rule ------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["standard", "bulk"]), st.integers(1, 300)),
        min_size=1,
        max_size=200,
    ),
    st.floats(0.0, 20.0),
    st.floats(0.0001, 0.05),
    st.integers(64, 8192),
)
def test_requests_of_other_lengths_never_raise_the_time_per_real_token(
    requests: list[tuple[str, int]], overhead: float, per_token: float, budget: int
) -> None:
    """On-time requests of other buckets join a batch only where they do not raise its
    predicted time per real token: the batch is no worse than its anchor's bucket alone."""
    items = [item(n, lane, tokens=t) for n, (lane, t) in enumerate(requests)]
    queues = queues_of(items)

    def cost(padded: int) -> float:
        return overhead + per_token * padded

    mixed = batch(queues, cost, budget=budget)
    anchor = next(e for lane in ("standard", "bulk") for e in queues.entries(lane))
    alone = queues_of([e.item for e in queues.all_entries() if e.bucket == anchor.bucket])
    single = batch(alone, cost, budget=budget)
    assert anchor in mixed  # the earliest deadline of the highest lane leads
    assert len(mixed) >= len(single)
    assert ratio(mixed, cost) <= ratio(single, cost) * (1 + 1e-9)
    assert len(mixed) <= 256 and (len(mixed) == 1 or mixed.padded <= budget)


def test_where_the_fixed_cost_dominates_lengths_mix_and_where_tokens_cost_they_do_not() -> None:
    items = [item(n, "standard", tokens=10 if n % 2 else 60) for n in range(40)]
    queues = queues_of(items)
    launch_bound = batch(queues, lambda p: 5.0 + 1e-5 * p, budget=4096)
    assert len(launch_bound) == 40  # padding is nearly free: one batch of everything
    token_bound = batch(queues, lambda p: 0.1 + 0.02 * p, budget=4096)
    assert {e.item.tokens for e in token_bound.entries} == {60}  # the anchor's length only


def test_short_texts_are_not_padded_to_a_long_realtime_request_they_could_do_without() -> None:
    """A realtime request of 20 tokens and a backlog of short texts (10, bucket 12): each
    short text padded to 20 lowers the batch's time per real token (the 2 ms is shared)
    but adds 0.4 ms, more than its share of a batch of short texts alone (0.25 ms): on
    a device where tokens cost, the realtime request goes with its own length only."""
    items = [item(0, "realtime", tokens=20)]
    items += [item(n, "standard", tokens=10) for n in range(1, 200)]
    token_bound = batch(queues_of(items), slow_device)
    assert {e.item.tokens for e in token_bound.entries} == {20}
    launch_bound = batch(queues_of(items), lambda p: 5.0 + 1e-5 * p)
    assert len(launch_bound) == 2048 // 20  # padding is nearly free there: they mix


# -- crowded overdue requests ------------------------------------------------------


def test_more_overdue_requests_than_a_batch_holds_are_taken_by_length() -> None:
    # 300 standard requests past their aging bound, short and long alternating: in
    # deadline order a batch of 2,048 tokens would hold 10 rows of 192.
    items = [item(n, "standard", tokens=150 if n % 3 == 1 else 10, at=n) for n in range(300)]
    for level in (DUE, LATE):
        queues = queues_of(items)
        draft = batch(queues, slow_device, level=level)
        first = queues.entries("standard")[0]
        assert first in draft  # the earliest deadline always leads
        assert {e.item.tokens for e in draft.entries} == {10}
        assert len(draft) == 2048 // 12


def test_overdue_requests_that_fit_one_batch_all_go_whatever_their_length() -> None:
    items = [item(n, "standard", tokens=150 if n == 3 else 10, at=n) for n in range(8)]
    draft = batch(queues_of(items), slow_device, level=DUE)
    assert len(draft) == 8  # aging's bound kept for every one of them


# -- crowded realtime ------------------------------------------------------------------


def test_a_crowd_of_realtime_rides_by_length_but_what_cannot_wait_goes_now() -> None:
    # 60 realtime requests: one long text, the rest short; a batch holds ~10 rows of 192.
    items = [item(n, "realtime", tokens=150 if n == 5 else 10, deadline=200 + n) for n in range(60)]
    queues = queues_of(items)
    draft = batch(queues, slow_device)
    assert {e.item.tokens for e in draft.entries} == {10}  # the long one waits a batch
    assert queues.entries("realtime")[0] in draft
    urgent = batch(queues, slow_device, urgent_ms=206)
    assert queues.entries("realtime")[5] in urgent  # its deadline cannot wait: it goes now
    few = queues_of(items[:8])
    assert len(batch(few, slow_device)) == 8  # all fit: all go


def test_a_backlog_of_mixed_lengths_drains_exactly_once_with_less_padding() -> None:
    tokens = [150 if n % 7 == 0 else 8 + n % 9 for n in range(1500)]
    arrivals = [item(n, ("standard", "bulk")[n % 2], tokens=t) for n, t in enumerate(tokens)]
    sched = scheduler(seq_buckets=",".join(map(str, BUCKETS)), queue_size=4096, max_items=256)
    run = drive(sched, arrivals, lambda plan: slow_device(plan.padded_tokens))
    out = sorted(it.payload for _, p in run for it in p.items)
    assert out == list(range(1500))
    assert sched.snapshot()["padding_ratio"] < 0.25


# -- the token estimate ----------------------------------------------------------------


def test_the_estimate_counts_specials_words_pieces_and_punctuation() -> None:
    assert estimate_tokens("", 256) == 2
    assert estimate_tokens("reset my password", 256) == 5
    assert estimate_tokens("reset my pass, please!", 256) == 8
    assert estimate_tokens("internationalisation", 256) == 2 + 1 + 20 // 9
    assert estimate_tokens("word " * 400, 256) == 256


@given(st.text(max_size=300), st.text(max_size=40))
def test_a_longer_text_is_never_estimated_shorter(text: str, more: str) -> None:
    assert estimate_tokens(text + " " + more, 10**6) >= estimate_tokens(text, 10**6)
    assert 2 <= estimate_tokens(text, 512) <= 512
