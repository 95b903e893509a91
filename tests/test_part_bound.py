"""The bound of a step's largest rank cost by part (``largest_rank_bound``): never above the plan the constructor
makes (``plan_with_media``) over families of (tokens, patches) pools, never above the best plan found by trying
every placement of tiny pools, and reached by each of its arguments where that argument is what binds."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.planning.scheduler.media import plan_with_media
from pipeline.planning.scheduler.part_bound import (
    cheapest_cover,
    cramped_bound,
    crowded_bound,
    largest_rank_bound,
    most_within,
    pigeonhole_bound,
    room_bound,
    water_level,
)
from pipeline.planning.shape import StepShape
from pipeline.spec.cost import CostModel, VisionCostModel

LLMS = st.sampled_from([CostModel(1.0, 100.0), CostModel(0.0, 1.0), CostModel(0.01, 1.0, 50.0)])
ENCODERS = st.sampled_from([VisionCostModel(2.0, 50.0), VisionCostModel(0.0, 1.0, 30.0), VisionCostModel(1.0, 0.0)])
FAMILIES = ("uniform", "one huge image", "mostly text", "equal", "long texts and images")


def tolerance(value: float) -> float:
    """Sums in another order round differently: the bound may sit a few ulps above a plan that reaches it."""
    return value * (1 + 1e-9) + 1e-9


@st.composite
def pools(draw: st.DrawFn, most: int, shapes: st.SearchStrategy[StepShape]) -> tuple[StepShape, np.ndarray, np.ndarray]:
    """A step shape and a pool of samples of one of ``FAMILIES``: (tokens, patches) each, every one fitting a
    micro-batch alone."""
    shape = draw(shapes)
    capacity, budget = shape.tokens_per_micro_batch, shape.patches_per_micro_batch or 512
    n = draw(st.integers(1, most))
    family = draw(st.sampled_from(FAMILIES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    tokens = rng.integers(1, capacity + 1, n)
    patches = rng.integers(0, budget + 1, n)
    if family == "one huge image":
        tokens, patches = rng.integers(1, capacity // 4 + 1, n), rng.integers(0, budget // 8 + 1, n)
        patches[rng.integers(n)] = budget
    elif family == "mostly text":
        patches[rng.random(n) < 0.8] = 0
    elif family == "equal":
        tokens, patches = np.full(n, tokens[0]), np.full(n, patches[0])
    elif family == "long texts and images":
        tokens = np.where(rng.random(n) < 0.5, rng.integers(capacity // 2 + 1, capacity + 1, n), tokens)
        patches[tokens > capacity // 2] = 0
    return shape, tokens.astype(np.int64), patches.astype(np.int64)


def shapes(ranks: tuple[int, int], micro_batches: tuple[int, int]) -> st.SearchStrategy[StepShape]:
    return st.builds(
        StepShape,
        ranks=st.integers(*ranks),
        micro_batches=st.integers(*micro_batches),
        tokens_per_micro_batch=st.sampled_from([16, 64, 256]),
        patches_per_micro_batch=st.sampled_from([0, 32, 256]),
    )


def part_values(lengths, patches, llm: CostModel, encoder: VisionCostModel) -> dict[str, np.ndarray]:
    """Each part's cost of every sample: a sample without patches costs the encoder nothing."""
    encoder_costs = np.where(patches > 0, encoder.costs(patches), 0.0)
    llm_costs = llm.costs(lengths)
    return {"encoder": encoder_costs, "LLM": llm_costs, "total": llm_costs + encoder_costs}


def best_plans(shape: StepShape, lengths, patches, values: dict[str, np.ndarray]) -> dict[str, float]:
    """Each part's least largest rank cost over every placement of the samples on the shape's micro-batches
    that keeps both capacities (the first sample in the first micro-batch: the others are alike)."""
    slots, n = shape.ranks * shape.micro_batches, lengths.size
    rest = np.array(list(itertools.product(range(slots), repeat=n - 1)), np.int64).reshape(slots ** (n - 1), n - 1)
    where = np.concatenate([np.zeros((rest.shape[0], 1), np.int64), rest], axis=1)  # (P, n) a slot each
    one_hot = where[:, :, None] == np.arange(slots)  # (P, n, slots)
    fits = (np.einsum("pns,n->ps", one_hot, lengths) <= shape.tokens_per_micro_batch).all(axis=1)
    if shape.patches_per_micro_batch:
        fits &= (np.einsum("pns,n->ps", one_hot, patches) <= shape.patches_per_micro_batch).all(axis=1)
    rank_of = one_hot.reshape(-1, n, shape.ranks, shape.micro_batches).any(axis=3)  # (P, n, ranks)
    best = {}
    for part, costs in values.items():
        loads = np.einsum("pnr,n->pr", rank_of[fits], costs)
        best[part] = float(loads.max(axis=1).min())
    return best


@settings(max_examples=150, deadline=None)
@given(pool=pools(60, shapes((1, 6), (1, 4))), llm=LLMS, encoder=ENCODERS, even=st.booleans())
def test_the_bound_is_never_above_the_constructors_plan(
    pool, llm: CostModel, encoder: VisionCostModel, even: bool
) -> None:
    """The constructor's plan of the pool (``plan_with_media``, the encoder's part evened out or not)."""
    shape, lengths, patches = pool
    values = part_values(lengths, patches, llm, encoder)
    plan = plan_with_media(lengths, shape, llm, None, patches, values["encoder"], even)
    placed = plan.placed_mask
    for part, costs in values.items():
        bound = largest_rank_bound(costs[placed], lengths[placed], patches[placed], shape)
        reached = float(plan.rank_totals(costs).max())
        assert bound <= tolerance(reached), (part, bound, reached)
        placed_costs = costs[placed]
        if placed_costs.size:  # at least the mean and the costliest sample
            assert bound >= placed_costs.sum() / shape.ranks and bound >= placed_costs.max()


@settings(max_examples=60, deadline=None)
@given(pool=pools(7, shapes((2, 3), (1, 2))), llm=LLMS, encoder=ENCODERS)
def test_the_bound_is_never_above_the_best_plan_of_a_tiny_pool(pool, llm: CostModel, encoder: VisionCostModel) -> None:
    shape, lengths, patches = pool
    values = part_values(lengths, patches, llm, encoder)
    plan = plan_with_media(lengths, shape, llm, None, patches, values["encoder"])
    placed = plan.placed_mask  # whatever the plan holds, some placement holds
    lengths, patches = lengths[placed], patches[placed]
    values = {part: costs[placed] for part, costs in values.items()}
    if not lengths.size:
        return
    best = best_plans(shape, lengths, patches, values)
    for part, costs in values.items():
        bound = largest_rank_bound(costs, lengths, patches, shape)
        assert bound <= tolerance(best[part]), (part, bound, best[part])
        reached = float(np.bincount(plan.rank[placed], weights=costs, minlength=shape.ranks).max())
        assert best[part] <= tolerance(reached), (part, best[part], reached)  # the search is exhaustive


def test_each_argument_binds_where_it_should() -> None:
    roomy = StepShape(ranks=2, micro_batches=4, tokens_per_micro_batch=100)
    ones = np.ones(4, np.int64)
    # One sample costlier than all the others together: no plan does better than that sample alone.
    assert largest_rank_bound(np.array([100.0, 1, 1, 1]), ones, 0 * ones, roomy) == 100.0
    # Three alike on two ranks: two of them share one.
    assert largest_rank_bound(np.array([10.0, 10, 10]), ones[:3], 0 * ones[:3], roomy) == 20.0
    assert pigeonhole_bound(np.array([9.0, 8, 7, 6, 5]), 2) == pytest.approx(max(9, 8 + 7, 7 + 6 + 5))
    # Room: rank B holds at most 2 samples of 10 tokens, so the third goes with the costly one on rank A.
    tight = StepShape(ranks=2, micro_batches=2, tokens_per_micro_batch=10)
    values, lengths, none = np.array([10.0, 1, 1, 1]), np.array([1, 10, 10, 10]), np.zeros(4, np.int64)
    assert max(values.sum() / 2, pigeonhole_bound(values, 2)) == 10.0
    assert largest_rank_bound(values, lengths, none, tight) == pytest.approx(11.0)
    assert best_plans(tight, lengths, none, {"x": values})["x"] == pytest.approx(11.0)
    # The same by patches: a budget of 10 a micro-batch.
    patched = StepShape(ranks=2, micro_batches=2, tokens_per_micro_batch=1000, patches_per_micro_batch=10)
    assert largest_rank_bound(values, np.ones(4, np.int64), lengths, patched) == pytest.approx(11.0)
    # A cramped rank: the text sample fills its micro-batch, so its rank holds 2 of the 6 images at most.
    cramped = StepShape(ranks=2, micro_batches=2, tokens_per_micro_batch=10, patches_per_micro_batch=10)
    lengths, patches = np.array([10, *[2] * 6]), np.array([0, *[5] * 6])
    values = np.array([0.0, *[1.0] * 6])  # the encoder's part
    assert max(values.sum() / 2, pigeonhole_bound(values, 2), room_bound(values, patches, 20)) == 3.0
    assert cramped_bound(values, lengths, patches, cramped) == pytest.approx(4.0)
    assert largest_rank_bound(values, lengths, patches, cramped) == pytest.approx(4.0)
    assert best_plans(cramped, lengths, patches, {"x": values})["x"] == pytest.approx(4.0)
    # Crowded ranks: two text samples fill a micro-batch each of 3 ranks x 2; an image fills one too, so the
    # ranks hold 1, 1 and 2 of the 4 images at most (or 0, 2 and 2): some rank holds 2, where one rank cramped
    # alone would allow 1.5.
    crowded = StepShape(ranks=3, micro_batches=2, tokens_per_micro_batch=10, patches_per_micro_batch=10)
    lengths, patches = np.array([10, 10, 2, 2, 2, 2]), np.array([0, 0, 10, 10, 10, 10])
    values = np.array([0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    assert cramped_bound(values, lengths, patches, crowded) == pytest.approx(1.5)
    assert crowded_bound(values, lengths, patches, crowded) == pytest.approx(2.0)
    assert largest_rank_bound(values, lengths, patches, crowded) == pytest.approx(2.0)
    assert best_plans(crowded, lengths, patches, {"x": values})["x"] == pytest.approx(2.0)
    assert water_level(np.array([1.0, 1.0, 2.0]), 4.0) == 2.0 and water_level(np.array([1.0, 1.0]), 3.0) == 0.0


@given(
    values=st.lists(st.floats(0, 100), min_size=1, max_size=12),
    weights=st.lists(st.integers(0, 20), min_size=12, max_size=12),
    need=st.integers(-5, 120),
)
def test_the_cover_is_the_cheapest_fractional_one(values: list[float], weights: list[int], need: int) -> None:
    """Against every subset: the whole samples covering ``need`` never cost less than the fractional cover."""
    v, w = np.array(values), np.array(weights[: len(values)], dtype=np.float64)
    cover = cheapest_cover(v, w, float(need))
    wholes = subset_sums(v, w, lambda weight: weight >= need)
    if wholes:
        assert cover <= tolerance(min(wholes))
    else:
        assert cover == pytest.approx(v.sum())
    if need <= 0:
        assert cover == 0.0


@given(
    values=st.lists(st.floats(0, 100), min_size=1, max_size=12),
    weights=st.lists(st.integers(0, 20), min_size=12, max_size=12),
    budget=st.integers(0, 120),
)
def test_the_knapsack_holds_at_least_any_whole_choice(values: list[float], weights: list[int], budget: int) -> None:
    """Against every subset: no whole samples within ``budget`` hold more than the fractional knapsack."""
    v, w = np.array(values), np.array(weights[: len(values)], dtype=np.float64)
    most = most_within(v, w, float(budget))
    wholes = subset_sums(v, w, lambda weight: weight <= budget)
    assert max(wholes) <= tolerance(most)
    assert most <= tolerance(float(v.sum()))


def subset_sums(values: np.ndarray, weights: np.ndarray, keep: Callable[[float], bool]) -> list[float]:
    """The values' sum of every subset of the samples whose weight ``keep`` takes."""
    subsets = (list(s) for k in range(values.size + 1) for s in itertools.combinations(range(values.size), k))
    return [float(values[s].sum()) for s in subsets if keep(float(weights[s].sum()))]
