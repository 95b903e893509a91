"""``even_parts``, the last search of a multimodal step's plan (the total, the encoder's part and the LLM's each
brought near its own bound), over families of (tokens, patches) pools: it places the same samples, keeps both
capacities of every micro-batch, never lifts the largest of the three loads over their bounds, is what
``plan_with_media`` returns, and gives the same plan every time."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings

from pipeline.planning.scheduler import validate_plan
from pipeline.planning.scheduler.media import plan_with_media
from pipeline.planning.scheduler.part_bound import largest_rank_bound
from pipeline.planning.scheduler.parts import even_parts
from pipeline.planning.scheduler.plan import StepPlan
from pipeline.planning.shape import StepShape
from pipeline.spec.cost import CostModel, VisionCostModel
from tests.test_part_bound import ENCODERS, LLMS, part_values, pools, shapes, tolerance


def largest_ratio(plan: StepPlan, lengths, patches, values: dict[str, np.ndarray], shape: StepShape) -> float:
    """The largest over the three loads of the costliest rank over that load's bound."""
    placed = plan.placed_mask
    ratios = []
    for costs in values.values():
        bound = largest_rank_bound(costs[placed], lengths[placed], patches[placed], shape)
        if bound > 0:
            ratios.append(float(plan.rank_totals(costs).max()) / bound)
    return max(ratios, default=1.0)


@settings(max_examples=300, deadline=None)
@given(pool=pools(80, shapes((1, 9), (1, 4))), llm=LLMS, encoder=ENCODERS)
def test_the_search_keeps_what_is_placed_and_never_lifts_the_largest_ratio(
    pool, llm: CostModel, encoder: VisionCostModel
) -> None:
    shape, lengths, patches = pool
    values = part_values(lengths, patches, llm, encoder)
    before = plan_with_media(lengths, shape, llm, None, patches, values["encoder"], near_bounds=False)
    after = even_parts(before, lengths, values["total"], patches, values["encoder"], shape)

    assert np.array_equal(after.placed_mask, before.placed_mask)
    validate_plan(after, lengths, patches)  # every sample once, both capacities of every micro-batch kept
    assert largest_ratio(after, lengths, patches, values, shape) <= tolerance(
        largest_ratio(before, lengths, patches, values, shape)
    )
    again = plan_with_media(lengths, shape, llm, None, patches, values["encoder"])
    assert np.array_equal(again.rank, after.rank) and np.array_equal(again.micro, after.micro)


def test_a_long_text_beside_big_images_takes_the_patch_dense_ones() -> None:
    """Two ranks of two micro-batches: a text that fills a micro-batch, two images of many patches and few tokens,
    four of few patches and many tokens. The plan before the search puts token-heavy images beside the text
    (19% over a bound); packing the pair again puts the patch-dense ones there, within 5% of every bound."""
    shape = StepShape(2, 2, 64, 64)
    lengths = np.array([23, 64, 5, 22, 5, 21, 27], np.int64)
    patches = np.array([4, 0, 32, 4, 16, 4, 4], np.int64)
    llm, encoder = CostModel(1.0, 100.0), VisionCostModel(2.0, 50.0)
    values = part_values(lengths, patches, llm, encoder)
    before = plan_with_media(lengths, shape, llm, None, patches, values["encoder"], near_bounds=False)
    after = even_parts(before, lengths, values["total"], patches, values["encoder"], shape)
    ratio_before = largest_ratio(before, lengths, patches, values, shape)
    ratio_after = largest_ratio(after, lengths, patches, values, shape)
    assert ratio_before > 1.15 and ratio_after <= 1.05, (ratio_before, ratio_after)
    text_rank = after.rank[1]
    assert set(np.flatnonzero(after.rank == text_rank).tolist()) >= {1, 2}  # the 32-patch image beside the text
