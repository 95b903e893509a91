"""plan_step against plain LPT (pipeline.planning.scheduler.plan_lpt) over families of length distributions.

The rule checked: plan_step is never worse than LPT made starvation-safe (``plan_lpt(...,
starvation_safe=True)``) on fill (tokens placed) nor on balance (costliest rank / lower bound of what is
placed, ``PlanSummary.balance_ratio``), on the same candidates; where plain LPT keeps the starvation
guarantee itself, the two LPT plans are one and the same.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.planning.scheduler import CostModel, StepPlan, plan_lpt, plan_step, validate_plan

# Pure quadratic, FLOP-like mixes, linear-dominated (beta >> alpha * L), linear only, a per-sample constant.
COST_MODELS = (
    CostModel(alpha=1.0, beta=0.0),
    CostModel(alpha=1.0, beta=100.0),
    CostModel.from_transformer(4096, 32),
    CostModel(alpha=1.0, beta=1e7),
    CostModel(alpha=0.0, beta=1.0),
    CostModel(alpha=1.0, beta=10.0, gamma=1e5),
)
FAMILIES = (
    "lognormal",
    "pareto",
    "zipf",
    "bimodal",
    "long_short",
    "uniform_long",
    "uniform",
    "rare_long",
    "bimodal_small",
)
# Balance ratios of two plans are recomputed with bincount sums; allow for the order of float additions.
RATIO_SLACK = 1e-9


def draw_lengths(family: str, rng: np.random.Generator, n: int, capacity: int) -> np.ndarray:
    """``n`` lengths in ``[0, capacity]`` (int64) from one family of distributions."""
    c = float(capacity)
    if family == "lognormal":
        raw = rng.lognormal(np.log(c * rng.uniform(1 / 64, 1 / 4)), rng.uniform(0.3, 1.5), n)
    elif family == "pareto":  # heavy tail up to the capacity
        raw = (rng.pareto(rng.uniform(1.05, 3.0), n) + 1) * max(1.0, c * rng.uniform(1 / 128, 1 / 16))
    elif family == "zipf":
        raw = rng.zipf(rng.uniform(1.3, 2.5), n) * max(1.0, c / 256)
    elif family == "bimodal":
        short = rng.normal(c / 16, c / 64, n)
        raw = np.where(rng.random(n) < rng.uniform(0.1, 0.5), rng.normal(c / 2, c / 8, n), short)
    elif family == "long_short":  # mostly short documents, a few near the context length
        raw = rng.lognormal(np.log(max(1.0, c / 50)), 0.9, n)
        long = rng.random(n) < rng.uniform(0.01, 0.1)
        raw[long] = rng.uniform(c / 4, c, int(long.sum()))
    elif family == "rare_long":  # a long/short mix: lognormal ~c/55, 3% uniform over c/4..c
        raw = rng.lognormal(np.log(max(1.0, c / 55)), 0.9, n)
        long = rng.random(n) < 0.03
        raw[long] = rng.uniform(c / 4, c, int(long.sum()))
    elif family == "bimodal_small":  # a bimodal pool: 20% about c/16, the rest about c/128
        raw = np.where(rng.random(n) < 0.2, rng.normal(c / 16, c / 64, n), rng.normal(c / 128, c / 512, n))
    elif family == "uniform_long":
        raw = rng.uniform(c / 2, c, n)
    else:
        raw = rng.uniform(0, c, n)
    return np.clip(np.round(raw), 0, capacity).astype(np.int64)


def pool(
    family: str, seed: int, ranks: int, micro_batches: int, capacity: int, load: float, most: int = 400_000
) -> np.ndarray:
    """Samples in priority order until they hold ``load`` times the step's tokens, or ``most`` samples."""
    rng = np.random.default_rng(seed)
    step_tokens = ranks * micro_batches * capacity
    chunks, total, count = [], 0, 0
    while total < load * step_tokens and count < most:
        chunk = draw_lengths(family, rng, min(4096, most - count), capacity)
        chunks.append(chunk)
        total += int(chunk.sum())
        count += chunk.size
    lengths = np.concatenate(chunks)
    return lengths[: int(np.searchsorted(np.cumsum(lengths), load * step_tokens)) + 1]


def _tokens(plan: StepPlan, lengths: np.ndarray) -> int:
    return int(lengths[plan.placed_mask].sum())


def _assert_starvation_safe(plan: StepPlan, lengths: np.ndarray) -> None:
    placed_lengths = np.where(plan.placed_mask, lengths, -1)
    newer_longest = np.append(np.maximum.accumulate(placed_lengths[::-1])[::-1][1:], -1)
    deferred = plan.deferred_indices
    assert (newer_longest[deferred] < lengths[deferred]).all()


def check_never_worse_than_lpt(
    lengths: np.ndarray, ranks: int, micro_batches: int, capacity: int, cost_model: CostModel
) -> None:
    plan = plan_step(lengths, ranks, micro_batches, capacity, cost_model)
    validate_plan(plan, lengths)
    _assert_starvation_safe(plan, lengths)
    again = plan_step(lengths.copy(), ranks, micro_batches, capacity, cost_model)
    assert np.array_equal(plan.rank, again.rank) and np.array_equal(plan.micro, again.micro)

    lpt = plan_lpt(lengths, ranks, micro_batches, capacity, cost_model)
    safe = plan_lpt(lengths, ranks, micro_batches, capacity, cost_model, starvation_safe=True)
    validate_plan(lpt, lengths)
    validate_plan(safe, lengths)
    _assert_starvation_safe(safe, lengths)
    ours, reference = plan.summary(lengths, cost_model), safe.summary(lengths, cost_model)
    assert ours.tokens_placed >= reference.tokens_placed
    assert ours.balance_ratio <= reference.balance_ratio * (1 + RATIO_SLACK)
    if np.array_equal(lpt.rank, safe.rank):  # plain LPT keeps the guarantee: then never worse than it
        assert np.array_equal(lpt.micro, safe.micro)


@settings(deadline=None, max_examples=300)
@given(
    family=st.sampled_from(FAMILIES),
    cost_model=st.sampled_from(COST_MODELS),
    seed=st.integers(0, 2**32 - 1),
    ranks=st.sampled_from([1, 2, 3, 5, 8, 16, 64]),
    micro_batches=st.integers(1, 8),
    capacity=st.sampled_from([1, 7, 64, 512, 4096, 32768]),
    load=st.floats(0.3, 1.5),
)
def test_never_worse_than_lpt(
    family: str, cost_model: CostModel, seed: int, ranks: int, micro_batches: int, capacity: int, load: float
) -> None:
    lengths = pool(family, seed, ranks, micro_batches, capacity, load, most=5000)
    check_never_worse_than_lpt(lengths, ranks, micro_batches, capacity, cost_model)


@pytest.mark.parametrize(
    ("family", "ranks", "micro_batches", "capacity", "cost_model"),
    [
        ("pareto", 256, 8, 8192, CostModel(alpha=1.0, beta=0.0)),  # a heavy tail under a quadratic cost
        ("long_short", 128, 2, 32768, CostModel.from_transformer(4096, 32)),  # its long/short mix at 32k
        ("lognormal", 4096, 4, 2048, CostModel.from_transformer(4096, 32)),
        ("zipf", 1024, 8, 1024, CostModel(alpha=1.0, beta=1e7)),
        ("uniform_long", 4096, 2, 512, CostModel(alpha=1.0, beta=10.0, gamma=1e5)),
    ],
)
def test_never_worse_than_lpt_at_scale(
    family: str, ranks: int, micro_batches: int, capacity: int, cost_model: CostModel
) -> None:
    lengths = pool(family, 11, ranks, micro_batches, capacity, 1.0)
    check_never_worse_than_lpt(lengths, ranks, micro_batches, capacity, cost_model)


def _python_lpt(
    lengths: np.ndarray, ranks: int, micro_batches: int, capacity: int, costs: np.ndarray
) -> tuple[list[int], list[int]]:
    """LPT as the textbook states it, in plain Python: by cost, highest first (ties by index), onto the least
    costly rank (ties: the lowest) whose micro-batches have room, into its first micro-batch with room."""
    limit = int(np.searchsorted(np.cumsum(lengths), ranks * micro_batches * capacity, side="right"))
    rank, micro = [-1] * lengths.size, [-1] * lengths.size
    load = [0.0] * ranks
    held = [[0] * micro_batches for _ in range(ranks)]
    for i in sorted(range(limit), key=lambda i: (-int(lengths[i]), i)):
        open_ranks = [r for r in range(ranks) if min(held[r]) + lengths[i] <= capacity]
        if not open_ranks:
            continue
        r = min(open_ranks, key=lambda r: (load[r], r))
        m = next(m for m in range(micro_batches) if held[r][m] + lengths[i] <= capacity)
        rank[i], micro[i] = r, m
        load[r] += costs[i]
        held[r][m] += int(lengths[i])
    return rank, micro


@settings(deadline=None, max_examples=80)
@given(
    lengths=st.lists(st.integers(0, 40), max_size=40),
    ranks=st.integers(1, 5),
    micro_batches=st.integers(1, 4),
    capacity=st.integers(40, 90),
    cost_model=st.sampled_from(COST_MODELS[:2]),
)
def test_plan_lpt_is_plain_lpt(
    lengths: list[int], ranks: int, micro_batches: int, capacity: int, cost_model: CostModel
) -> None:
    array = np.array(lengths, np.int64)
    plan = plan_lpt(array, ranks, micro_batches, capacity, cost_model)
    rank, micro = _python_lpt(array, ranks, micro_batches, capacity, cost_model.costs(array))
    assert plan.rank.tolist() == rank and plan.micro.tolist() == micro


def test_an_unsafe_lpt_is_repaired_at_a_cost_in_fill() -> None:
    """Plain LPT places both 4s and defers the older 2: no starvation-safe plan places more than 6 tokens
    here, so against plain LPT the guarantee is on balance and fill of its starvation-safe version."""
    lengths = np.array([2, 4, 4], np.int64)
    lpt = plan_lpt(lengths, 1, 2, 5)
    assert lpt.rank.tolist() == [-1, 0, 0]
    safe = plan_lpt(lengths, 1, 2, 5, starvation_safe=True)
    assert safe.rank.tolist() == [0, 0, -1]
    plan = plan_step(lengths, 1, 2, 5)
    assert _tokens(plan, lengths) == 6 and plan.rank[0] == 0
