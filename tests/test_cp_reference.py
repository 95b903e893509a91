"""The quick paths of context-parallel planning against their definitions, over families of shapes and costs: the
least block size (one or two sizes priced, not every size), the step's lower bound (only the samples that may be
slowest searched), the sliding maximum the block kernel scores windows of ranks by, and the step-time simulation
(vectorized over block micro-batches)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.planning.scheduler._kernels.blocks import _window_max
from pipeline.planning.scheduler.context_parallel import (
    CPMode,
    CPPlan,
    CPShape,
    cp_sizes,
    lower_bound,
    plan_cp_step,
    slice_tokens,
)
from pipeline.spec.cost import CostModel
from pipeline.spec.cp_cost import ContextParallelCost
from tests.test_context_parallel import steps


@st.composite
def costs(draw: st.DrawFn) -> ContextParallelCost:
    return ContextParallelCost(
        model=CostModel(alpha=draw(st.sampled_from([0.0, 1.0, 1e4])), beta=draw(st.sampled_from([0.0, 1e6, 4e8]))),
        flops_per_s=draw(st.sampled_from([1e9, 400e12])),
        nvlink_bytes_per_s=draw(st.sampled_from([1e9, 400e9])),
        network_bytes_per_s=draw(st.sampled_from([1e8, 50e9, 1e12])),  # 1e12: a network faster than NVLink
        ranks_per_node=draw(st.sampled_from([1, 2, 4, 8])),
        gamma_s=draw(st.sampled_from([0.0, 1e-6, 1e-3])),
    )


def _times_by_size(lengths: np.ndarray, shape: CPShape, cost: ContextParallelCost, gpu: bool) -> np.ndarray:
    """GPU time (or a rank's time) of every sample on every size of the mode, inf where its slice does not fit."""
    out = np.full((lengths.size, len(shape.sizes())), np.inf)
    for k, c in enumerate(shape.sizes()):
        fits = slice_tokens(lengths, np.full(lengths.size, c)) <= shape.capacity
        price = cost.gpu_time if gpu else cost.per_rank
        out[:, k] = np.where(fits, price(lengths, c, c <= cost.ranks_per_node), np.inf)
    return out


@settings(max_examples=150, deadline=None)
@given(steps(), costs())
def test_the_least_size_is_the_cheapest_that_fits_and_the_smallest_among_equals(
    step: tuple[np.ndarray, CPShape], cost: ContextParallelCost
) -> None:
    lengths, shape = step
    times = _times_by_size(lengths, shape, cost, gpu=True)
    cheapest = times.min(axis=1, keepdims=True)
    equal = np.isfinite(times) & (times <= cheapest * (1 + 1e-6))
    expected = np.where(equal.any(axis=1), np.asarray(shape.sizes())[equal.argmax(axis=1)], 0)
    assert cp_sizes(lengths, shape, cost).tolist() == expected.tolist()


def test_a_sample_one_rank_holds_is_not_split_where_splitting_costs_the_same() -> None:
    """Ring traffic hidden: splitting a sample costs no GPU time, and a split only a rounding cheaper is none."""
    lengths = np.arange(1500, 8193, 7)
    shape = CPShape(1024, 4, 8192, CPMode.FREE, 1024)
    assert (cp_sizes(lengths, shape, ContextParallelCost()) == 1).all()
    plan = plan_cp_step(lengths, shape, ContextParallelCost())
    assert (plan.cp[plan.placed_mask] == 1).all()


@settings(max_examples=150, deadline=None)
@given(steps(), costs())
def test_the_lower_bound_is_the_one_every_size_gives(
    step: tuple[np.ndarray, CPShape], cost: ContextParallelCost
) -> None:
    lengths, shape = step
    gpu, rank = _times_by_size(lengths, shape, cost, gpu=True), _times_by_size(lengths, shape, cost, gpu=False)
    placeable = np.isfinite(gpu).any(axis=1)
    spread = gpu[placeable].min(axis=1).sum() / shape.ranks if placeable.any() else 0.0
    slowest = rank[placeable].min(axis=1).max(initial=0.0)
    assert np.isclose(lower_bound(lengths, shape, cost), max(spread, slowest), rtol=1e-12, atol=0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0, 1e3, allow_nan=False), min_size=1, max_size=80),
    st.integers(1, 80),
    st.booleans(),
)
def test_the_sliding_maximum_is_the_largest_of_each_window(values: list[float], c: int, aligned: bool) -> None:
    array = np.asarray(values)
    c = min(c, array.size)
    out = np.full(array.size, -1.0)
    _window_max(array, c, aligned, out)
    for first in range(0, array.size - c + 1, c if aligned else 1):
        assert out[first] == array[first : first + c].max()


def _step_time(plan: CPPlan, lengths: np.ndarray, cost: ContextParallelCost) -> tuple[np.ndarray, float]:
    """Slot by slot, sample by sample: every rank's micro-batch times, and the step's time when a block's ranks
    start a block micro-batch together."""
    shape = plan.shape
    times = np.zeros((shape.ranks, shape.max_micro_batches))
    for i in np.flatnonzero(plan.placed_mask):
        first, c, m = int(plan.rank[i]), int(plan.cp[i]), int(plan.micro[i])
        times[first : first + c, m] += cost.per_rank(lengths[i : i + 1], c, bool(cost.within_node(first, c)))[0]
    ready = np.zeros(shape.ranks)
    for m in range(shape.max_micro_batches):
        start = ready.copy()
        for i in np.flatnonzero(plan.placed_mask & (plan.micro == m)):
            first, c = int(plan.rank[i]), int(plan.cp[i])
            start[first : first + c] = ready[first : first + c].max()
        ready = start + times[:, m]
    return times, float(ready.max())


@settings(max_examples=100, deadline=None)
@given(steps(), costs())
def test_the_step_time_is_the_simulation_slot_by_slot(
    step: tuple[np.ndarray, CPShape], cost: ContextParallelCost
) -> None:
    lengths, shape = step
    plan = plan_cp_step(lengths, shape, cost)
    times, step_time = _step_time(plan, lengths, cost)
    assert np.array_equal(plan.micro_times(lengths, cost), times)
    assert plan.step_time(lengths, cost) == step_time
