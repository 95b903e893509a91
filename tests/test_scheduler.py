"""Properties of the balancing scheduler (pipeline.planning.scheduler), checked with hypothesis."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.planning.scheduler import CostModel, StepPlan, plan_step, rank_order, validate_plan

# Integer-valued alpha and beta keep costs exact in float64, so brute force compares exactly.
COSTS = CostModel(alpha=1.0, beta=100.0)
# LPT on identical machines is within 4/3 - 1/(3R) of the optimum (Graham 1969); with room for every
# sample, plan_step is LPT, so it must meet that bound.
LPT_FACTOR = 4 / 3

# Settings per test, not a profile loaded here: loading one at import would change them for every module
# collected after this one (tests/conftest.py loads the project's deterministic profile, which these extend).
# No deadline: the first example of a run compiles (or loads) the numba kernels.


@st.composite
def steps(draw: st.DrawFn, max_samples: int = 60) -> tuple[np.ndarray, int, int, int]:
    ranks = draw(st.integers(1, 6))
    micro_batches = draw(st.integers(1, 4))
    capacity = draw(st.integers(1, 300))
    lengths = draw(st.lists(st.integers(0, capacity), min_size=0, max_size=max_samples))
    return np.array(lengths, np.int64), ranks, micro_batches, capacity


def _plan(step: tuple[np.ndarray, int, int, int]) -> StepPlan:
    lengths, ranks, micro_batches, capacity = step
    return plan_step(lengths, ranks, micro_batches, capacity, COSTS)


@settings(deadline=None, max_examples=60)
@given(steps())
def test_plan_is_valid(step: tuple) -> None:
    lengths = step[0]
    plan = _plan(step)
    validate_plan(plan, lengths)  # each sample once (placed or deferred), capacity respected
    assert plan.rank.dtype == np.int32 and plan.micro.dtype == np.int32
    assert np.array_equal(plan.rank < 0, plan.micro < 0)
    assert np.array_equal(plan.deferred_indices, np.flatnonzero(~plan.placed_mask))


@settings(deadline=None, max_examples=60)
@given(steps())
def test_same_input_same_plan(step: tuple) -> None:
    first, second = _plan(step), _plan((step[0].copy(), *step[1:]))
    assert np.array_equal(first.rank, second.rank)
    assert np.array_equal(first.micro, second.micro)


@settings(deadline=None, max_examples=60)
@given(steps())
def test_largest_rank_never_below_lower_bound(step: tuple) -> None:
    lengths = step[0]
    plan = _plan(step)
    summary = plan.summary(lengths, COSTS)
    assert summary.max_rank_cost >= summary.lower_bound * (1 - 1e-12)
    assert summary.tokens_placed <= summary.token_capacity


@settings(deadline=None, max_examples=60)
@given(steps())
def test_no_older_sample_deferred_for_a_newer_one_at_least_as_long(step: tuple) -> None:
    """The guarantee against starvation: if sample i is deferred, every placed sample j > i is strictly
    shorter than i (i could always have taken j's place without breaking capacity or raising a cost)."""
    lengths = step[0]
    plan = _plan(step)
    placed = plan.placed_mask
    for i in plan.deferred_indices:
        newer_placed = lengths[i + 1 :][placed[i + 1 :]]
        assert (newer_placed < lengths[i]).all()


@settings(deadline=None, max_examples=60)
@given(steps())
def test_prefix_that_fits_is_placed_when_samples_are_small(step: tuple) -> None:
    """Samples no longer than a tenth of a micro-batch, half the capacity asked: all placed."""
    _, ranks, micro_batches, capacity = step
    rng = np.random.default_rng(capacity)
    lengths = rng.integers(0, max(capacity // 10, 1) + 1, 4 * ranks * micro_batches * 10)
    lengths = lengths[np.cumsum(lengths) <= ranks * micro_batches * capacity // 2]
    plan = plan_step(lengths, ranks, micro_batches, capacity, COSTS)
    assert plan.placed_mask.all()


def _optimal_max_rank_cost(costs: np.ndarray, ranks: int) -> float:
    best = np.inf
    for assignment in itertools.product(range(ranks), repeat=costs.size):
        loads = np.bincount(np.array(assignment, np.int64), weights=costs, minlength=ranks)
        best = min(best, loads.max())
    return best


@settings(deadline=None, max_examples=40)
@given(st.integers(1, 3), st.lists(st.integers(1, 50), min_size=1, max_size=7))
def test_within_lpt_factor_of_brute_force_optimum(ranks: int, raw: list[int]) -> None:
    lengths = np.array(raw, np.int64)
    capacity = int(lengths.sum())  # one micro-batch can hold everything: all must be placed
    plan = plan_step(lengths, ranks, 1, capacity, COSTS)
    assert plan.placed_mask.all()
    optimum = _optimal_max_rank_cost(COSTS.costs(lengths), ranks)
    assert plan.rank_costs(lengths, COSTS).max() <= LPT_FACTOR * optimum


@settings(deadline=None, max_examples=60)
@given(steps())
def test_rank_order_matches_plan(step: tuple) -> None:
    plan = _plan(step)
    for r in range(plan.ranks):
        indices, micro_batch = rank_order(plan, r)
        assert indices.dtype == np.int64 and micro_batch.dtype == np.int32
        assert sorted(indices.tolist()) == np.flatnonzero(plan.rank == r).tolist()
        assert (np.diff(micro_batch) >= 0).all()
        assert np.array_equal(micro_batch, plan.micro[indices])
        for m in range(plan.micro_batches):
            members = indices[micro_batch == m]
            assert (np.diff(members) > 0).all(), "oldest first within a micro-batch"


def _assert_starvation_safe(plan: StepPlan, lengths: np.ndarray) -> None:
    """No deferred sample has a newer placed sample at least as long (vectorised over a suffix maximum)."""
    placed_lengths = np.where(plan.placed_mask, lengths, -1)
    newer_longest = np.maximum.accumulate(placed_lengths[::-1])[::-1]  # longest placed at index >= i
    newer_longest = np.append(newer_longest[1:], -1)  # ... at index > i
    deferred = plan.deferred_indices
    assert (newer_longest[deferred] < lengths[deferred]).all()


@settings(deadline=None, max_examples=40)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(1, 48),
    st.integers(1, 8),
    st.sampled_from([64, 1024, 4096]),
    st.floats(0.5, 1.3),
)
def test_large_steps_keep_every_property(seed: int, ranks: int, micro_batches: int, capacity: int, load: float) -> None:
    """Steps large enough for every phase (LPT, dealing, top-up, repair, moves), some over-full."""
    rng = np.random.default_rng(seed)
    step_tokens = ranks * micro_batches * capacity
    lengths = np.clip(rng.lognormal(np.log(capacity / 8), 1.0, 4 * step_tokens // capacity * 8 + 8), 1, capacity)
    lengths = lengths.astype(np.int64)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), load * step_tokens)) + 1]
    plan = plan_step(lengths, ranks, micro_batches, capacity)
    validate_plan(plan, lengths)
    _assert_starvation_safe(plan, lengths)
    summary = plan.summary(lengths)
    assert summary.max_rank_cost >= summary.lower_bound * (1 - 1e-12)
    again = plan_step(lengths.copy(), ranks, micro_batches, capacity)
    assert np.array_equal(plan.rank, again.rank) and np.array_equal(plan.micro, again.micro)


@pytest.mark.parametrize("median", [300, 1500, 6000])
def test_balance_within_two_percent_with_enough_samples_per_rank(median: int) -> None:
    rng = np.random.default_rng(median)
    ranks, micro_batches, capacity = 32, 8, 16384
    lengths = np.clip(rng.lognormal(np.log(median), 1.0, 200_000), 1, capacity).astype(np.int64)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), ranks * micro_batches * capacity)) + 1]
    assert lengths.size >= 8 * ranks
    plan = plan_step(lengths, ranks, micro_batches, capacity)
    summary = plan.summary(lengths)
    assert summary.balance_ratio <= 1.02
    assert summary.tokens_placed >= 0.97 * summary.token_capacity
    _assert_starvation_safe(plan, lengths)


def test_a_full_step_defers_only_its_newest_samples() -> None:
    """The balanced placement keeps back the newest half percent of the step's tokens for the top-up, so on a
    step of small samples the ones that wait are the newest, not old short ones."""
    rng = np.random.default_rng(3)
    ranks, micro_batches, capacity = 64, 16, 8192
    step_tokens = ranks * micro_batches * capacity
    lengths = np.clip(rng.lognormal(np.log(500), 0.8, 30_000), 1, capacity).astype(np.int64)
    plan = plan_step(lengths, ranks, micro_batches, capacity)
    deferred = plan.deferred_indices
    assert deferred.size > 0
    newest = int(np.searchsorted(np.cumsum(lengths), 0.99 * step_tokens))  # samples from here on are the newest
    assert deferred.min() >= newest
    summary = plan.summary(lengths)
    assert summary.balance_ratio <= 1.01 and summary.tokens_placed >= 0.99 * step_tokens


def test_repair_swaps_an_older_deferred_sample_into_a_newer_ones_place() -> None:
    from pipeline.planning.scheduler._kernels.greedy import longest_first
    from pipeline.planning.scheduler._kernels.repair import prefer_older, starvation_safe
    from pipeline.planning.scheduler._kernels.state import Candidates, Grid, Placement, by_index

    lengths = np.array([5, 3, 8, 5], np.int64)  # sample 0 deferred; 2 and 3 newer and at least as long
    costs = COSTS.costs(lengths)
    cands = Candidates(*longest_first(lengths, costs, 4, 8), np.zeros(0, np.int64), np.zeros(0))
    assert cands.order.tolist() == [2, 0, 3, 1]
    at = np.array([0, -1, 1, 0], np.int32)  # rank << 0 | micro-batch 0, by position: rank = [-1, 0, 0, 1]
    micro_cost = np.array([costs[1] + costs[2], costs[3]])
    plan = Placement(at, micro_cost.copy(), np.array([11, 5], np.int64), micro_cost, np.zeros(2, np.int64))
    grid = Grid(ranks=2, micro=1, capacity=16, shift=0)
    assert not starvation_safe(cands, grid, at)
    assert prefer_older(cands, plan, grid) == 1
    assert starvation_safe(cands, grid, at)
    assert prefer_older(cands, plan, grid) == 0  # a safe plan: nothing to swap
    rank, _ = by_index(4, cands.order, at, 0)
    assert rank.tolist() == [1, 0, 0, -1]  # the shortest at least as long (5, not 8) gives way
    assert plan.tokens.tolist() == [11, 5] and plan.rank_cost[1] == costs[0]


def test_balances_a_realistic_step() -> None:
    rng = np.random.default_rng(7)
    lengths = np.clip(rng.lognormal(np.log(500), 0.8, 6000), 1, 8192).astype(np.int64)
    plan = plan_step(lengths, 16, 8, 8192)
    validate_plan(plan, lengths)
    summary = plan.summary(lengths)
    assert summary.balance_ratio <= 1.02
    assert summary.tokens_placed >= 0.97 * summary.token_capacity


def test_sample_longer_than_capacity_is_named() -> None:
    with pytest.raises(ValueError, match=r"lengths\[2\] = 11 exceeds capacity 10"):
        plan_step(np.array([1, 2, 11], np.int64), 2, 1, 10)


def _balance_fill(plan: StepPlan, lengths: np.ndarray) -> float:
    """Mean over largest rank cost times the share of the step's tokens placed: what a start competes on."""
    costs = plan.rank_costs(lengths, COSTS)
    balance = float(costs.mean() / costs.max()) if costs.max() > 0 else 1.0
    return balance * float(lengths[plan.placed_mask].sum()) / (plan.ranks * plan.micro_batches * plan.capacity)


def _as_plan(start: np.ndarray, ranks: int, micro_batches: int, capacity: int) -> StepPlan:
    placed = start >= 0
    rank = np.where(placed, start // micro_batches, -1).astype(np.int32)
    micro = np.where(placed, start % micro_batches, -1).astype(np.int32)
    return StepPlan(rank, micro, ranks, micro_batches, capacity)


@st.composite
def started_steps(draw: st.DrawFn) -> tuple[np.ndarray, int, int, int, np.ndarray]:
    """A step and a start for it: each sample, in a random order, into a random micro-batch with room (or
    none); or a step cut from full micro-batches, with a start that places every sample or all but a few."""
    lengths, ranks, micro_batches, capacity = draw(steps())
    slots = ranks * micro_batches
    if draw(st.booleans()):  # cut every micro-batch into pieces: a start that places everything
        pieces, where = [], []
        for slot in range(slots):
            left = capacity
            while left > 0 and len(pieces) < 60:
                piece = draw(st.integers(1, left))
                pieces.append(piece)
                where.append(slot)
                left -= piece
        order = draw(st.permutations(range(len(pieces))))
        where = np.array(where, np.int64)[order]
        if draw(st.booleans()):  # and some of them left out: the scheduler places them where it can
            where[draw(st.lists(st.integers(0, len(where) - 1), max_size=4))] = -1
        return np.array(pieces, np.int64)[order], ranks, micro_batches, capacity, where
    held = np.zeros(slots, np.int64)
    start = np.full(lengths.size, -1, np.int64)
    for i in draw(st.permutations(range(lengths.size))):
        slot = draw(st.integers(-1, slots - 1))
        if slot >= 0 and held[slot] + lengths[i] <= capacity:
            start[i] = slot
            held[slot] += lengths[i]
    return lengths, ranks, micro_batches, capacity, start


@settings(deadline=None, max_examples=200)
@given(started_steps())
def test_a_start_keeps_every_guarantee_and_is_never_lost(step: tuple) -> None:
    """With a start the plan is valid, the same on every call, starvation-safe, and scores (balance times
    fill) at least as well as the start itself where the start places every sample."""
    lengths, ranks, micro_batches, capacity, start = step
    plan = plan_step(lengths, ranks, micro_batches, capacity, COSTS, start=start)
    validate_plan(plan, lengths)
    again = plan_step(lengths.copy(), ranks, micro_batches, capacity, COSTS, start=start.copy())
    assert np.array_equal(plan.rank, again.rank) and np.array_equal(plan.micro, again.micro)
    placed = plan.placed_mask
    for i in plan.deferred_indices:
        assert (lengths[i + 1 :][placed[i + 1 :]] < lengths[i]).all()
    if (start >= 0).all():
        given_plan = _as_plan(start, ranks, micro_batches, capacity)
        assert _balance_fill(plan, lengths) >= _balance_fill(given_plan, lengths) - 1e-12


def test_a_start_that_packs_better_is_kept() -> None:
    """LPT puts 7 and 6 on the two ranks, then 3 and 2 on the cheaper ones, and the last 2 fits nowhere;
    the start 7 + 3 | 6 + 2 + 2 places every sample, about as balanced."""
    lengths, start = np.array([7, 6, 3, 2, 2]), np.array([1, 0, 1, 0, 0])
    assert not plan_step(lengths, 2, 1, 10, COSTS).placed_mask.all()
    plan = plan_step(lengths, 2, 1, 10, COSTS, start=start)
    np.testing.assert_array_equal(plan.rank, start)
    assert plan.placed_mask.all()


@pytest.mark.parametrize(
    ("start", "named"),
    [
        (np.array([0, 1]), r"one per sample \(3\)"),
        (np.array([0.0, 1.0, 1.0]), "integers"),
        (np.array([0, 2, -1]), r"start\[1\] = 2 is not a micro-batch"),
        (np.array([0, -2, -1]), r"start\[1\] = -2"),
        (np.array([1, 1, 1]), "12 tokens in micro-batch 1, more than its capacity 10"),
    ],
)
def test_bad_starts_are_named(start: np.ndarray, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        plan_step(np.array([4, 4, 4], np.int64), 2, 1, 10, COSTS, start=start)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"ranks": 0}, "ranks"),
        ({"micro_batches": 0}, "micro_batches"),
        ({"capacity": 0}, "capacity"),
        ({"ranks": 2.5}, "ranks"),
        ({"lengths": np.array([1, -3], np.int64)}, "lengths"),
        ({"lengths": np.array([1.0, 2.0])}, "lengths"),
        ({"lengths": np.ones((2, 2), np.int64)}, "lengths"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, named: str) -> None:
    arguments = {"lengths": np.array([1, 2], np.int64), "ranks": 2, "micro_batches": 1, "capacity": 10}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=named):
        plan_step(**arguments)


def test_validate_plan_catches_overfull_micro_batch() -> None:
    lengths = np.array([6, 6], np.int64)
    plan = StepPlan(np.zeros(2, np.int32), np.zeros(2, np.int32), ranks=1, micro_batches=1, capacity=10)
    with pytest.raises(ValueError, match="12 tokens, over the capacity 10"):
        validate_plan(plan, lengths)


def test_validate_plan_catches_half_placed_sample() -> None:
    plan = StepPlan(np.array([0], np.int32), np.array([-1], np.int32), ranks=1, micro_batches=1, capacity=10)
    with pytest.raises(ValueError, match="half placed"):
        validate_plan(plan, np.array([1], np.int64))


def test_cost_model_from_transformer() -> None:
    model = CostModel.from_transformer(1024, 2, causal=False)
    assert model.beta == 24 * 1024**2 * 2 and model.alpha == 4 * 1024 * 2
    assert CostModel.from_transformer(1024, 2).alpha == model.alpha / 2
    with pytest.raises(ValueError, match="hidden_size"):
        CostModel.from_transformer(0, 2)
    with pytest.raises(ValueError, match="alpha"):
        CostModel(alpha=-1.0, beta=1.0)


@settings(deadline=None, max_examples=80)
@given(
    st.lists(st.integers(1, 2**21), max_size=300),
    st.sampled_from([(1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (8.78e-8, 1.92e-3, 0.0), (2.8e-6, 0.06, 0.4)]),
)
def test_total_cost_is_the_sum_of_the_costs(lengths: list[int], coefficients: tuple[float, float, float]) -> None:
    model = CostModel(*coefficients)
    as_array = np.array(lengths, dtype=np.int64)
    exact = math.fsum(model.costs(as_array))
    assert model.total(as_array) == pytest.approx(exact, rel=1e-12, abs=0.0)
    huge = np.full(4, 2**31, dtype=np.int64)  # L**2 summed overflows int64: counted exactly all the same
    assert model.total(huge) == pytest.approx(math.fsum(model.costs(huge)), rel=1e-12)
