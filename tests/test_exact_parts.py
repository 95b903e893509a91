"""The per-part bound (``largest_rank_bound``) against the least largest rank found exactly by a mixed-integer
program (``benchmarks/exact_parts_bench.least_largest``, HiGHS) on pools too big to try every placement of, and the
benchmark's figures of a step: all parts at once never below their bounds, the planner never below the least."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.exact_parts_bench import StepSamples, least_largest, step_figures
from pipeline.planning.scheduler.media import plan_with_media
from pipeline.planning.scheduler.part_bound import largest_rank_bound
from pipeline.planning.shape import StepShape
from pipeline.spec.cost import CostModel, VisionCostModel
from tests.test_part_bound import ENCODERS, LLMS, part_values, pools, shapes, tolerance


def _planned(pool, llm: CostModel, encoder: VisionCostModel) -> tuple[StepShape, StepSamples, dict]:
    """The pool's samples that the constructor's plan places, where it places them, and each part's costs."""
    shape, lengths, patches = pool
    values = part_values(lengths, patches, llm, encoder)
    plan = plan_with_media(lengths, shape, llm, None, patches, values["encoder"])
    placed = plan.placed_mask
    samples = StepSamples(lengths[placed], patches[placed], values["encoder"][placed], plan.rank[placed])
    return shape, samples, {part: costs[placed] for part, costs in values.items()}


@settings(max_examples=30, deadline=None)
@given(pool=pools(24, shapes((2, 3), (1, 2))), llm=LLMS, encoder=ENCODERS)
def test_the_bound_is_never_above_the_least_found_exactly(pool, llm: CostModel, encoder: VisionCostModel) -> None:
    shape, samples, values = _planned(pool, llm, encoder)
    if not samples.lengths.size:
        return
    for part, costs in values.items():
        scale = max(float(costs.sum()) / shape.ranks, 1e-12)  # the solver's tolerances are absolute
        least = least_largest(samples, [costs / scale], [np.array([1.0])], shape, time_limit=60)
        assert least.proven, (part, least)
        bound = largest_rank_bound(costs, samples.lengths, samples.patches, shape) / scale
        reached = float(np.bincount(samples.rank, weights=costs, minlength=shape.ranks).max()) / scale
        assert bound <= tolerance(least.value) + 1e-6, (part, bound, least)
        assert least.value <= tolerance(reached) + 1e-6, (part, least, reached)


@settings(max_examples=15, deadline=None)
@given(pool=pools(16, shapes((2, 3), (2, 2))), llm=st.just(CostModel(0.01, 1.0)), encoder=ENCODERS)
def test_a_steps_figures_hold_the_planner_to_the_least(pool, llm: CostModel, encoder: VisionCostModel) -> None:
    """``step_figures`` prices with the benchmark's models, whatever ``llm`` drew the pool's costs."""
    shape, samples, _ = _planned(pool, llm, encoder)
    if not samples.lengths.size or not samples.encoder.any():
        return
    figures = step_figures(samples, shape, time_limit=60)
    assert figures.least_parts.proven and figures.least_sum.proven
    assert figures.least_parts.value >= 1 - 1e-6  # no part below its bound
    assert figures.least_parts.value <= figures.planned_parts + 1e-6
    assert figures.least_sum.value <= figures.planned_sum + 1e-6
