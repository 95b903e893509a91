"""``plan_with_media``'s levels of effort over families of (tokens, patches) pools: every level places the same
samples, so that step composition can compare its options' fills at the cheapest, and every level's plan keeps
both capacities of every micro-batch."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.planning.scheduler import validate_plan
from pipeline.planning.scheduler.media import Effort, plan_with_media
from pipeline.planning.shape import StepShape
from pipeline.spec.cost import CostModel, VisionCostModel
from tests.test_part_bound import ENCODERS, LLMS, part_values, pools, shapes


@settings(max_examples=300, deadline=None)
@given(pool=pools(80, shapes((1, 9), (1, 4))), llm=LLMS, encoder=ENCODERS, text=st.booleans())
def test_every_level_places_the_same_samples(pool, llm: CostModel, encoder: VisionCostModel, text: bool) -> None:
    shape, lengths, patches = pool
    if text:  # the same lengths as a text step: no patches, no encoder
        shape = StepShape(shape.ranks, shape.micro_batches, shape.tokens_per_micro_batch)
        patches = np.zeros_like(patches)
    encoder_costs = part_values(lengths, patches, llm, encoder)["encoder"]
    plans = {
        effort: plan_with_media(lengths, shape, llm, None, patches, encoder_costs, effort=effort) for effort in Effort
    }
    for effort, plan in plans.items():
        validate_plan(plan, lengths, patches)
        assert np.array_equal(plan.placed_mask, plans[Effort.NEAR_BOUNDS].placed_mask), effort


def test_balancing_starts_from_the_placement() -> None:
    """Five samples on two ranks of two micro-batches where full micro-batches leave no room to move one: the
    placement's costliest rank is 15% above the balanced plan's, which trades samples between the ranks."""
    shape = StepShape(2, 2, 64, 64)
    lengths, patches = np.array([37, 49, 51, 63, 21], np.int64), np.array([35, 15, 0, 46, 29], np.int64)
    llm = CostModel(1.0, 0.01)
    encoder_costs = part_values(lengths, patches, llm, VisionCostModel(1.0, 0.0))["encoder"]
    costs = llm.costs(lengths) + encoder_costs
    placed, balanced = (
        plan_with_media(lengths, shape, llm, None, patches, encoder_costs, effort=effort)
        for effort in (Effort.PLACEMENT, Effort.BALANCED)
    )
    assert np.array_equal(placed.placed_mask, balanced.placed_mask)
    assert placed.rank_totals(costs).max() > 1.1 * balanced.rank_totals(costs).max()
