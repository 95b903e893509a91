"""The scheduler at 10,240 ranks: plans are valid, starvation-safe, deterministic and never worse
than starvation-safe LPT; ``rank_orders`` is ``rank_order`` of every rank, in one pass."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.planning.scheduler import CostModel, StepPlan, plan_lpt, plan_step, rank_order, rank_orders, validate_plan

RANKS = 10240
FLOPS = CostModel.from_transformer(4096, 32)


def _pool(family: str, seed: int, micro_batches: int, capacity: int, load: float) -> np.ndarray:
    """Lengths in priority order until they hold ``load`` times the step's tokens."""
    rng = np.random.default_rng(seed)
    step_tokens = RANKS * micro_batches * capacity
    mean = {"lognormal": 500 * np.exp(0.8**2 / 2), "long_short": 1500.0, "pareto": 3 * capacity / 64}[family]
    n = int(load * step_tokens / mean * 1.2) + 1024
    if family == "lognormal":
        raw = rng.lognormal(np.log(500), 0.8, n)
    elif family == "long_short":  # mostly short documents, 3% of 8k-32k tokens
        raw = rng.lognormal(np.log(600), 0.9, n)
        long = rng.random(n) < 0.03
        raw[long] = rng.uniform(8192, 32768, int(long.sum()))
    else:  # a heavy tail up to the capacity
        raw = (rng.pareto(1.5, n) + 1) * capacity / 64
    lengths = np.clip(raw, 1, capacity).astype(np.int64)
    end = int(np.searchsorted(np.cumsum(lengths), load * step_tokens))
    assert end < n, "the pool must overflow the step"
    return lengths[: end + 1]


def _assert_starvation_safe(plan: StepPlan, lengths: np.ndarray) -> None:
    placed_lengths = np.where(plan.placed_mask, lengths, -1)
    newer_longest = np.append(np.maximum.accumulate(placed_lengths[::-1])[::-1][1:], -1)
    deferred = plan.deferred_indices
    assert (newer_longest[deferred] < lengths[deferred]).all()


def _assert_rank_orders_match(plan: StepPlan, ranks: list[int]) -> None:
    orders = rank_orders(plan)
    assert orders.indices.dtype == np.int64 and orders.micro.dtype == np.int32
    assert orders.bounds.shape == (plan.ranks + 1,) and orders.bounds[-1] == plan.placed_mask.sum()
    assert np.array_equal(np.sort(orders.indices), np.flatnonzero(plan.placed_mask))  # each placed sample once
    assert np.array_equal(plan.rank[orders.indices], np.repeat(np.arange(plan.ranks), np.diff(orders.bounds)))
    for r in ranks:
        indices, micro = rank_order(plan, r)
        got_indices, got_micro = orders.of(r)
        assert np.array_equal(indices, got_indices) and np.array_equal(micro, got_micro), r


def test_a_ten_thousand_rank_step_of_two_million_samples() -> None:
    """10,240 ranks x 4 micro-batches of 32k tokens, a lognormal pool of 105% of the
    step, about 2M samples."""
    lengths = _pool("lognormal", 10, 4, 32768, 1.05)
    assert 1_900_000 < lengths.size < 2_200_000
    plan = plan_step(lengths, RANKS, 4, 32768, FLOPS)
    validate_plan(plan, lengths)  # every sample at most once, no micro-batch over capacity
    _assert_starvation_safe(plan, lengths)
    again = plan_step(lengths.copy(), RANKS, 4, 32768, FLOPS)
    assert np.array_equal(plan.rank, again.rank) and np.array_equal(plan.micro, again.micro)
    summary = plan.summary(lengths, FLOPS)
    assert summary.tokens_placed >= 0.99 * summary.token_capacity
    assert summary.max_rank_cost >= summary.lower_bound * (1 - 1e-12)
    assert np.bincount(plan.rank[plan.placed_mask], minlength=RANKS).min() > 0, "a rank got nothing"
    _assert_rank_orders_match(plan, [0, 1, 4095, 5000, RANKS - 1])


@pytest.mark.parametrize(
    ("family", "micro_batches", "capacity", "load", "cost_model"),
    [
        ("long_short", 2, 32768, 1.05, FLOPS),
        ("pareto", 2, 8192, 1.02, CostModel(alpha=1.0, beta=0.0)),
        ("lognormal", 1, 16384, 0.9, CostModel(alpha=1.0, beta=1e7)),  # room for all: every sample placed
    ],
)
def test_ten_thousand_ranks_never_worse_than_safe_lpt(
    family: str, micro_batches: int, capacity: int, load: float, cost_model: CostModel
) -> None:
    lengths = _pool(family, 11, micro_batches, capacity, load)
    plan = plan_step(lengths, RANKS, micro_batches, capacity, cost_model)
    validate_plan(plan, lengths)
    _assert_starvation_safe(plan, lengths)
    safe = plan_lpt(lengths, RANKS, micro_batches, capacity, cost_model, starvation_safe=True)
    ours, reference = plan.summary(lengths, cost_model), safe.summary(lengths, cost_model)
    assert ours.tokens_placed >= reference.tokens_placed
    assert ours.balance_ratio <= reference.balance_ratio * (1 + 1e-9)
    if load < 1:
        assert plan.placed_mask.all()
    _assert_rank_orders_match(plan, [0, RANKS // 2, RANKS - 1])


@settings(deadline=None, max_examples=80)
@given(
    st.integers(1, 40),
    st.integers(1, 6),
    st.integers(1, 64),
    st.lists(st.integers(0, 64), max_size=300),
)
def test_rank_orders_is_rank_order_of_every_rank(ranks: int, micro_batches: int, capacity: int, raw: list[int]) -> None:
    lengths = np.minimum(np.array(raw, np.int64), capacity)
    plan = plan_step(lengths, ranks, micro_batches, capacity)
    _assert_rank_orders_match(plan, list(range(ranks)))


def test_rank_orders_names_a_bad_rank() -> None:
    orders = rank_orders(plan_step(np.array([1, 2, 3], np.int64), 2, 1, 4))
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 2\), got 2"):
        orders.of(2)
