"""Context-parallel steps (``plan_cp_step``) over families of pools, shapes and modes: every plan valid, every
sample placed once or deferred under the guarantee against starvation, a pool with room placed nearly whole
with its longest sample, close to the step's lower bound, and never slower than static context parallelism."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.cp_bench import POOLS, Pool, pool_of
from pipeline.planning.scheduler.context_parallel import (
    CPMode,
    CPPlan,
    CPShape,
    cp_sizes,
    lower_bound,
    padded,
    plan_cp_step,
    slice_tokens,
    static_shape,
    validate_cp_plan,
)
from pipeline.spec.cp_cost import ContextParallelCost

COST = ContextParallelCost()


def _pool(rng: np.random.Generator, family: str, n: int, longest: int) -> np.ndarray:
    draw = {
        "lognormal": lambda: rng.lognormal(np.log(longest / 40), 1.3, n),
        "bytescale": lambda: np.where(
            rng.random(n) < 0.8, rng.integers(16, max(17, longest // 64), n), rng.uniform(1, longest, n)
        ),
        "books": lambda: np.where(rng.random(n) < 0.01, rng.uniform(longest / 4, longest, n), rng.integers(8, 400, n)),
        "ties": lambda: rng.choice([longest // 16 or 1, longest // 4 or 1, longest], n),
        "uniform": lambda: rng.integers(1, longest + 1, n),
    }[family]()
    return np.clip(np.rint(draw), 1, longest).astype(np.int64)


FAMILIES = ("lognormal", "bytescale", "books", "ties", "uniform")


@st.composite
def steps(draw: st.DrawFn) -> tuple[np.ndarray, CPShape]:
    mode = draw(st.sampled_from(list(CPMode)))
    ranks = draw(st.sampled_from([1, 2, 4, 6, 8, 16, 24, 32]))
    micro = draw(st.integers(1, 4))
    capacity = draw(st.sampled_from([64, 256, 1024]))
    sizes = [s for s in (1, 2, 4, 8, 16, 32) if s <= ranks]
    if mode is CPMode.FREE:
        sizes = list(range(1, ranks + 1))
    size = draw(st.sampled_from(sizes))
    if mode is CPMode.STATIC and ranks % size:
        size = 1
    longest = capacity * size
    family = draw(st.sampled_from(FAMILIES))
    fill = draw(st.sampled_from([0.3, 0.9, 1.5]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = _pool(rng, family, 4096, longest)
    keep = int(np.searchsorted(np.cumsum(lengths), fill * ranks * micro * capacity, side="right"))
    return lengths[: max(1, keep)], CPShape(ranks, micro, capacity, mode, size)


@settings(max_examples=150, deadline=None)
@given(steps())
def test_every_plan_is_valid_and_no_sample_waits_for_a_newer_one_of_its_kind(step: tuple[np.ndarray, CPShape]) -> None:
    lengths, shape = step
    plan = plan_cp_step(lengths, shape, COST)
    validate_cp_plan(plan, lengths)
    placed = plan.placed_mask
    assert (slice_tokens(lengths[placed], plan.cp[placed]) <= shape.capacity).all()
    # The guarantee: a sample not split waits for no newer one not split at least as long; a split one for no
    # newer one at least as long on a block of at least its least size (of a size the mode gives it too).
    least = cp_sizes(lengths, shape, COST)
    newer_placed = placed & (np.arange(lengths.size)[None, :] > np.arange(lengths.size)[:, None])
    for i in np.flatnonzero(~placed & (least > 0)):
        rivals = newer_placed[i] & (lengths >= lengths[i])
        if least[i] == 1:
            rivals &= plan.cp == 1
        else:
            rivals &= (plan.cp >= least[i]) & np.isin(plan.cp, least[i] << np.arange(8))
            if shape.mode is CPMode.STATIC:
                rivals &= plan.cp == least[i]
        assert not rivals.any(), (
            f"sample {i} ({lengths[i]} tokens, least cp {least[i]}) waits for {np.flatnonzero(rivals)[:3]}"
        )


@pytest.mark.parametrize("pool", POOLS, ids=[pool.name for pool in POOLS])
@pytest.mark.parametrize("mode", [CPMode.ALIGNED, CPMode.FREE])
@pytest.mark.parametrize(("capacity", "longest"), [(8192, 262144), (32768, 2097152)])
def test_a_pool_with_room_is_placed_near_its_bound_and_never_slower_than_static(
    pool: Pool, mode: CPMode, capacity: int, longest: int
) -> None:
    """The benchmark's pools (``benchmarks/cp_bench.py``) at 64 ranks, each holding 95% of the step's tokens and
    its longest sample: at most 3% of the tokens wait, never the longest; at least 0.95 of the lower bound."""
    ranks, micro = 64, 4
    for seed in range(2):
        lengths = pool_of(pool, np.random.default_rng([seed, capacity]), ranks * micro * capacity, longest)
        shape = CPShape(ranks, micro, capacity, mode, ranks)
        plan = plan_cp_step(lengths, shape, COST)
        validate_cp_plan(plan, lengths)
        deferred = lengths[~plan.placed_mask].sum() / lengths.sum()
        assert deferred <= 0.03, f"{deferred:.1%} of the tokens wait"
        assert plan.placed_mask[int(np.argmax(lengths))], "the longest sample waits"
        bound = lower_bound(lengths, shape, COST)
        assert bound / plan.step_time(lengths, COST) >= 0.95, (seed, bound / plan.step_time(lengths, COST))
        static = plan_cp_step(lengths, static_shape(lengths, ranks, micro, capacity), COST)
        assert plan.tokens_per_second(lengths, COST) >= static.tokens_per_second(lengths, COST)


def test_a_sample_no_block_holds_is_deferred_and_said_so() -> None:
    shape = CPShape(4, 2, 100, CPMode.ALIGNED, 2)
    lengths = np.array([50, 500, 60], np.int64)  # 500 tokens need 3 ranks of 100 (padded to 4 x 2 x 63)
    plan = plan_cp_step(lengths, shape, COST)
    assert plan.rank.tolist()[1] == -1 and cp_sizes(lengths, shape, COST)[1] == 0
    assert plan.placed_mask[[0, 2]].all()


def test_padding_and_slices_follow_the_zigzag_layout() -> None:
    assert padded(np.array([5, 5, 8, 9]), np.array([1, 2, 2, 4])).tolist() == [5, 8, 8, 16]
    assert slice_tokens(np.array([5, 9, 17]), np.array([1, 2, 4])).tolist() == [5, 6, 6]


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"size": 3, "mode": CPMode.ALIGNED}, "power of two"),
        ({"size": 9}, "more than the step's"),
        ({"ranks": 6, "size": 4, "mode": CPMode.STATIC}, "whole blocks"),
        ({"max_micro_batches": 1, "micro_batches": 2}, "below micro_batches"),
    ],
)
def test_a_bad_shape_is_refused_naming_what_is_wrong(changes: dict, problem: str) -> None:
    values = {"ranks": 8, "micro_batches": 2, "capacity": 64, "mode": CPMode.FREE, "size": 4} | changes
    with pytest.raises(ValueError, match=problem):
        CPShape(**values)


def test_validation_refuses_a_micro_batch_over_its_capacity_and_a_block_off_its_alignment() -> None:
    lengths = np.array([60, 60, 150], np.int64)
    shape = CPShape(4, 1, 100, CPMode.ALIGNED, 4)
    plan = plan_cp_step(lengths, shape, COST)
    validate_cp_plan(plan, lengths)
    crowded = CPPlan(np.array([0, 0, 2], np.int32), np.array([1, 1, 2], np.int32), np.zeros(3, np.int32), shape)
    with pytest.raises(ValueError, match="rank 0 micro-batch 0 holds 120 slice tokens, over the capacity 100"):
        validate_cp_plan(crowded, lengths)
    misaligned = CPPlan(
        np.array([0, 1, 1], np.int32), np.array([1, 1, 2], np.int32), np.array([0, 0, 1], np.int32), shape
    )
    with pytest.raises(ValueError, match="aligned"):
        validate_cp_plan(misaligned, lengths)
