"""What the observing tools read of a context-parallel step (``pipeline/tools/observe/cp_steps.py``): the plan its
batches carry gives back the planner's own step time, block sizes and micro-batches, whatever the mode and however
the ranks numbered their micro-batches; the times against the bound and against static CP are the planner's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.planning.scheduler.context_parallel import CPMode, CPShape, lower_bound, plan_cp_step, static_shape
from pipeline.planning.step.assemble_cp import build_cp_batches
from pipeline.spec.cp_cost import ContextParallelCost
from pipeline.tools.observe.cp_steps import CPWeighing, counted_rows, cp_step_stats, written_plan
from topics.errors import MixflowError
from topics.formats.sample import Sample

COSTS = (
    ContextParallelCost(),
    ContextParallelCost(ranks_per_node=2, network_bytes_per_s=5e9, gamma_s=1e-4),
)


@st.composite
def cp_steps(draw: st.DrawFn) -> tuple[list[Sample], CPShape, ContextParallelCost]:
    """A step of samples up to what the largest block holds, of every length family, in every mode."""
    mode = draw(st.sampled_from(list(CPMode)))
    ranks = draw(st.sampled_from([2, 4, 6, 8]))
    size = draw(st.sampled_from([s for s in (1, 2, 4, 8) if s <= ranks and ranks % s == 0]))
    if mode is CPMode.FREE:
        size = draw(st.integers(1, ranks))
    capacity = draw(st.integers(16, 300))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(0, 40))
    family = draw(st.sampled_from(["lognormal", "few long", "all short"]))
    longest = capacity * size
    if family == "lognormal":
        lengths = rng.lognormal(np.log(capacity / 3), 1.2, n)
    elif family == "few long":
        lengths = np.where(rng.random(n) < 0.15, rng.integers(capacity, longest + 1, n), rng.integers(1, 40, n))
    else:
        lengths = rng.integers(1, max(2, capacity // 4), n)
    lengths = np.clip(lengths, 1, longest).astype(np.int64)
    samples = [Sample(f"s{i}", f"src{i % 3}", np.zeros(int(n), np.int32)) for i, n in enumerate(lengths)]
    micro = draw(st.integers(1, 3))
    return samples, CPShape(ranks, micro, capacity, mode, size), draw(st.sampled_from(COSTS))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cp_steps())
def test_the_written_plan_takes_the_planners_time_with_the_same_blocks(
    step: tuple[list[Sample], CPShape, ContextParallelCost],
) -> None:
    samples, shape, cost = step
    lengths = np.array([s.length for s in samples], np.int64)
    plan = plan_cp_step(lengths, shape, cost)
    batches = build_cp_batches(3, plan, samples)
    got_lengths, got = written_plan(batches, shape)
    placed = np.flatnonzero(plan.placed_mask)
    # The same samples on the same blocks.
    ids = [s for b in batches for s, own in zip(b.sample_ids, counted_rows(b), strict=True) if own]
    assert sorted(zip(ids, got.rank.tolist(), got.cp.tolist(), strict=True)) == sorted(
        (samples[i].sample_id, int(plan.rank[i]), int(plan.cp[i])) for i in placed
    )
    np.testing.assert_array_equal(np.sort(got_lengths), np.sort(lengths[placed]))
    assert got.micro.max(initial=-1) < shape.max_micro_batches, "indices within the step's micro-batches"
    assert got.step_time(got_lengths, cost) == pytest.approx(plan.step_time(lengths, cost), rel=1e-9, abs=1e-15)
    np.testing.assert_allclose(got.rank_times(got_lengths, cost), plan.rank_times(lengths, cost), atol=1e-15)
    stats = cp_step_stats(batches, CPWeighing(shape, cost))
    assert stats.step_s == pytest.approx(plan.step_time(lengths, cost), rel=1e-9, abs=1e-15)
    assert stats.bound_s == pytest.approx(lower_bound(lengths[placed], shape, cost))
    assert stats.step_s >= stats.bound_s * (1 - 1e-9)
    assert stats.micro_batches.tolist() == [b.micro_batches for b in batches]
    assert int(stats.samples_at.sum()) == placed.size and int(stats.tokens_at.sum()) == int(lengths[placed].sum())
    for c, n in zip(stats.sizes.tolist(), stats.samples_at.tolist(), strict=True):
        assert n == int((plan.cp[placed] == c).sum())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cp_steps())
def test_static_is_the_planners_static_plan_of_the_written_samples(
    step: tuple[list[Sample], CPShape, ContextParallelCost],
) -> None:
    samples, shape, cost = step
    lengths = np.array([s.length for s in samples], np.int64)
    batches = build_cp_batches(0, plan_cp_step(lengths, shape, cost), samples)
    stats = cp_step_stats(batches, CPWeighing(shape, cost))
    written, _ = written_plan(batches, shape)
    try:
        static = static_shape(written, shape.ranks, shape.micro_batches, shape.capacity)
    except ValueError:
        assert stats.static_s is None and stats.static_size is None and stats.static_over_written is None
        return
    expected = plan_cp_step(written, static, cost)
    assert stats.static_size == static.size
    assert stats.static_s == pytest.approx(expected.step_time(written, cost))
    assert stats.static_deferred == int((~expected.placed_mask).sum())


def test_a_block_whose_ranks_run_its_micro_batches_in_other_orders_is_refused() -> None:
    shape = CPShape(2, 2, 64, CPMode.ALIGNED, 2)
    samples = [Sample(f"s{i}", "a", np.zeros(n, np.int32)) for i, n in enumerate([100, 90])]
    lengths = np.array([100, 90])
    from pipeline.planning.scheduler.cp_plan import CPPlan

    plan = CPPlan(np.array([0, 0], np.int32), np.array([2, 2], np.int32), np.array([0, 1], np.int32), shape)
    batches = build_cp_batches(0, plan, samples)
    swapped = build_cp_batches(0, CPPlan(plan.rank, plan.cp, np.array([1, 0], np.int32), shape), samples)
    assert written_plan(batches, shape)[1].step_time(lengths, COSTS[0]) > 0
    # Rank 1 runs the two samples of the block the other way round: rank 0's order then waits on nothing.
    with pytest.raises(ValueError, match="block of 2 from rank 0 do not run its micro-batches alike"):
        written_plan([batches[0], swapped[1]], shape)


def test_a_step_of_another_shape_than_the_specs_is_refused() -> None:
    shape = CPShape(4, 2, 64, CPMode.ALIGNED, 4)
    samples = [Sample("a", "s", np.zeros(200, np.int32))]
    batches = build_cp_batches(0, plan_cp_step(np.array([200]), shape), samples)
    for other in (CPShape(4, 2, 128, CPMode.ALIGNED, 4), CPShape(4, 2, 64, CPMode.FREE, 4)):
        with pytest.raises(MixflowError, match="give the job's own spec"):
            cp_step_stats(batches, CPWeighing(other, COSTS[0]))
