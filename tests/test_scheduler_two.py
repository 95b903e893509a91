"""The scheduler with two capacities (``plan_step(..., costs=, patches=, patch_capacity=)``): multimodal
samples whose cost is the LLM's plus the vision encoder's, in micro-batches that hold at most so many tokens
and so many patches. Checked over families of samples (text only, image-heavy, mixed, a few huge images,
clips) and step shapes, against plain and starvation-safe LPT with both capacities."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipeline.planning.scheduler import CostModel, StepPlan, plan_lpt, plan_step, validate_plan
from pipeline.spec.cost import VisionCostModel
from tests.multimodal_families import FAMILIES, Multimodal, draw_multimodal
from tests.test_scheduler_lpt import FAMILIES as LENGTH_FAMILIES
from tests.test_scheduler_lpt import pool

# Balance ratios of two plans are recomputed with bincount sums; allow for the order of float additions.
RATIO_SLACK = 1e-9
SHAPES = st.tuples(st.sampled_from([1, 2, 3, 5, 8, 16]), st.integers(1, 6), st.sampled_from([64, 512, 4096]))


def _models(capacity: int, patch_capacity: int, encoder_share: float) -> tuple[CostModel, VisionCostModel]:
    """An LLM and an encoder whose costs of a full micro-batch compare as ``encoder_share`` to 1."""
    llm = CostModel(alpha=1.0 / capacity, beta=1.0)
    scale = encoder_share * 2.0 * capacity / (2.0 * patch_capacity)
    return llm, VisionCostModel(alpha=scale / patch_capacity, beta=scale)


def _step(family: str, seed: int, shape: tuple[int, int, int], ratio: int, load: float) -> tuple[Multimodal, int]:
    """Samples in priority order holding about ``load`` times the step's tokens, and the patch capacity."""
    ranks, micro_batches, capacity = shape
    patch_capacity = max(4, ratio * capacity)
    rng = np.random.default_rng(seed)
    samples = draw_multimodal(family, rng, 4 * ranks * micro_batches * 16 + 8, capacity, patch_capacity)
    keep = int(np.searchsorted(np.cumsum(samples.lengths), load * ranks * micro_batches * capacity)) + 1
    cut = int(samples.items[:keep].sum())
    return Multimodal(
        samples.lengths[:keep], samples.patches[:keep], samples.item_patches[:cut], samples.items[:keep]
    ), patch_capacity


def _assert_guarantee(plan: StepPlan, lengths: np.ndarray, patches: np.ndarray) -> None:
    """No deferred sample has a newer placed one at least as long with at least as many patches."""
    placed = plan.placed_mask
    for i in plan.deferred_indices.tolist():
        newer = placed[i + 1 :] & (lengths[i + 1 :] >= lengths[i]) & (patches[i + 1 :] >= patches[i])
        assert not newer.any(), f"sample {i} waits for newer sample {i + 1 + int(np.argmax(newer))}"


def _score(plan: StepPlan, lengths: np.ndarray, costs: np.ndarray) -> tuple[int, float]:
    """Tokens placed, and the costliest rank over the lower bound of what is placed."""
    placed = plan.placed_mask
    if not placed.any():
        return 0, 1.0
    lower = max(float(costs[placed].sum()) / plan.ranks, float(costs[placed].max()))
    return int(lengths[placed].sum()), float(plan.rank_totals(costs).max()) / lower if lower > 0 else 1.0


@settings(deadline=None, max_examples=150)
@given(
    family=st.sampled_from(FAMILIES),
    seed=st.integers(0, 2**32 - 1),
    shape=SHAPES,
    ratio=st.sampled_from([1, 2, 4]),
    load=st.floats(0.3, 1.5),
    encoder_share=st.sampled_from([0.0, 0.5, 1.0, 4.0]),
    tolerance=st.sampled_from([0.0, 0.001, 0.05]),
    secondary=st.booleans(),
)
def test_two_capacities_keep_every_guarantee_and_are_never_worse_than_safe_lpt(
    family: str,
    seed: int,
    shape: tuple,
    ratio: int,
    load: float,
    encoder_share: float,
    tolerance: float,
    secondary: bool,
) -> None:
    """Valid in both capacities, the same on every call, the guarantee on length and patches, and never worse
    than starvation-safe LPT with both capacities on fill or on balance of the total cost, whether or not the
    encoder's part is evened out too (``secondary``)."""
    samples, patch_capacity = _step(family, seed, shape, ratio, load)
    lengths, patches = samples.lengths, samples.patches
    llm, vision = _models(shape[2], patch_capacity, encoder_share)
    costs = samples.costs(llm, vision)
    encoder = vision.sample_costs(samples.item_patches, samples.items) if secondary else None
    kwargs = {"costs": costs, "patches": patches, "patch_capacity": patch_capacity}
    plan = plan_step(lengths, *shape, tolerance=tolerance, encoder_costs=encoder, **kwargs)
    validate_plan(plan, lengths, patches)
    _assert_guarantee(plan, lengths, patches)
    copies = {"costs": costs.copy(), "patches": patches.copy(), "patch_capacity": patch_capacity}
    again = plan_step(lengths.copy(), *shape, tolerance=tolerance, encoder_costs=encoder, **copies)
    assert np.array_equal(plan.rank, again.rank) and np.array_equal(plan.micro, again.micro)
    safe = plan_lpt(lengths, *shape, starvation_safe=True, **kwargs)
    validate_plan(safe, lengths, patches)
    _assert_guarantee(safe, lengths, patches)
    (tokens, ratio_ours), (safe_tokens, safe_ratio) = _score(plan, lengths, costs), _score(safe, lengths, costs)
    assert tokens >= safe_tokens
    assert ratio_ours <= safe_ratio * (1 + RATIO_SLACK)
    assert ratio_ours >= 1 - 1e-12


@settings(deadline=None, max_examples=100)
@given(
    family=st.sampled_from(LENGTH_FAMILIES),
    seed=st.integers(0, 2**32 - 1),
    shape=SHAPES,
    load=st.floats(0.3, 1.5),
    patch_capacity=st.sampled_from([0, 1, 10**6]),
    tolerance=st.sampled_from([0.0, 0.001, 0.05]),
)
@example(family="lognormal", seed=0, shape=(8, 1, 64), load=1.0, patch_capacity=1, tolerance=0.05)
def test_text_planned_with_two_capacities_is_the_text_plan_with_trades(
    family: str, seed: int, shape: tuple, load: float, patch_capacity: int, tolerance: float
) -> None:
    """Samples without patches whose costs are the cost model's: the kernels for two capacities (costliest
    first, searches over both rooms, the repair on length and patches) make the one-capacity plan, which the
    trades between ranks then only improve: LPT is the same plan, and where the text plan places the same
    samples its costliest rank is no cheaper, unless both are within ``tolerance`` of the lower bound. (Text
    steps have one candidate more, the prefix plan, which may place more: it never places fewer tokens.)"""
    model = CostModel(alpha=1.0 / shape[2], beta=1.0)
    lengths = pool(family, seed, *shape, load, most=3000)
    text = plan_step(lengths, *shape, model, tolerance=tolerance)
    two = plan_step(
        lengths,
        *shape,
        model,
        tolerance=tolerance,
        costs=model.costs(lengths),
        patches=np.zeros(lengths.size, np.int64),
        patch_capacity=patch_capacity,
    )
    costs = model.costs(lengths)
    assert int(lengths[text.placed_mask].sum()) >= int(lengths[two.placed_mask].sum())
    if np.array_equal(text.placed_mask, two.placed_mask):
        # Both stop moving samples within ``tolerance`` of the lower bound, so only there may the two differ.
        reachable = max(text.rank_totals(costs).max(), (1 + tolerance) * text.lower_bound(lengths, costs=costs))
        assert two.rank_totals(costs).max() <= reachable * (1 + RATIO_SLACK)
    for starvation_safe in (False, True):
        text_lpt = plan_lpt(lengths, *shape, model, starvation_safe=starvation_safe)
        two_lpt = plan_lpt(lengths, *shape, model, starvation_safe=starvation_safe, costs=model.costs(lengths))
        assert np.array_equal(text_lpt.rank, two_lpt.rank) and np.array_equal(text_lpt.micro, two_lpt.micro)


def _python_lpt(samples: Multimodal, costs: np.ndarray, shape: tuple[int, int, int], patch_capacity: int) -> list:
    """LPT with two capacities as the textbook states it: the prefix that fits the step in both, by cost,
    highest first (ties by index), onto the least costly rank (ties: the lowest) with a micro-batch with room
    for both, into its first such micro-batch."""
    ranks, micro_batches, capacity = shape
    slots = ranks * micro_batches
    fits = (np.cumsum(samples.lengths) <= slots * capacity) & (np.cumsum(samples.patches) <= slots * patch_capacity)
    limit = int(np.argmin(fits)) if not fits.all() else fits.size
    at = [-1] * samples.lengths.size
    load = [0.0] * ranks
    tokens = [[0] * micro_batches for _ in range(ranks)]
    patches = [[0] * micro_batches for _ in range(ranks)]
    for i in sorted(range(limit), key=lambda i: (-costs[i], i)):
        length, patch = int(samples.lengths[i]), int(samples.patches[i])

        def room(r: int, m: int, length: int = length, patch: int = patch) -> bool:
            return tokens[r][m] + length <= capacity and patches[r][m] + patch <= patch_capacity

        open_ranks = [r for r in range(ranks) if any(room(r, m) for m in range(micro_batches))]
        if open_ranks:
            r = min(open_ranks, key=lambda r: (load[r], r))
            m = next(m for m in range(micro_batches) if room(r, m))
            at[i] = r * micro_batches + m
            load[r] += costs[i]
            tokens[r][m] += length
            patches[r][m] += patch
    return at


@settings(deadline=None, max_examples=80)
@given(family=st.sampled_from(FAMILIES), seed=st.integers(0, 2**32 - 1), load=st.floats(0.3, 1.5))
def test_plan_lpt_with_two_capacities_is_plain_lpt(family: str, seed: int, load: float) -> None:
    shape = (3, 2, 256)
    samples, patch_capacity = _step(family, seed, shape, 2, load)
    costs = samples.costs(*_models(shape[2], patch_capacity, 1.0))
    plan = plan_lpt(samples.lengths, *shape, costs=costs, patches=samples.patches, patch_capacity=patch_capacity)
    expected = _python_lpt(samples, costs, shape, patch_capacity)
    got = np.where(plan.rank >= 0, plan.rank.astype(np.int64) * shape[1] + plan.micro, -1)
    assert got.tolist() == expected


@pytest.mark.parametrize(
    ("family", "shape", "ratio"),
    [("image-heavy", (64, 4, 8192), 2), ("mixed", (256, 2, 4096), 4), ("video", (128, 8, 2048), 1)],
)
def test_two_capacities_at_scale(family: str, shape: tuple[int, int, int], ratio: int) -> None:
    samples, patch_capacity = _step(family, 5, shape, ratio, 1.1)
    costs = samples.costs(*_models(shape[2], patch_capacity, 1.0))
    kwargs = {"costs": costs, "patches": samples.patches, "patch_capacity": patch_capacity}
    plan = plan_step(samples.lengths, *shape, **kwargs)
    validate_plan(plan, samples.lengths, samples.patches)
    _assert_guarantee(plan, samples.lengths, samples.patches)
    safe = plan_lpt(samples.lengths, *shape, starvation_safe=True, **kwargs)
    (tokens, ratio_ours), (safe_tokens, safe_ratio) = (
        _score(plan, samples.lengths, costs),
        _score(safe, samples.lengths, costs),
    )
    assert tokens >= safe_tokens and ratio_ours <= safe_ratio * (1 + RATIO_SLACK)


def test_the_encoder_part_is_evened_out_where_the_total_is_even_already() -> None:
    """Two images and two texts of one total cost each: LPT puts both images on rank 0 (costs tie, so the
    lowest rank), which is balanced in total; with the encoder's part given, an image and a text trade
    places."""
    lengths = np.array([10, 20, 10, 20])
    encoder = np.array([10.0, 0.0, 10.0, 0.0])
    costs = lengths + encoder  # an LLM cost of one a token
    kwargs = {"costs": costs, "patches": np.array([40, 0, 40, 0]), "patch_capacity": 100}
    total_only = plan_step(lengths, 2, 1, 40, **kwargs)
    assert total_only.rank.tolist() == [0, 1, 0, 1] and total_only.rank_totals(encoder).tolist() == [20.0, 0.0]
    both = plan_step(lengths, 2, 1, 40, encoder_costs=encoder, **kwargs)
    assert both.rank_totals(encoder).tolist() == [10.0, 10.0] and both.rank_totals(costs).tolist() == [40.0, 40.0]


def test_micro_batches_too_full_to_move_a_sample_are_balanced_by_trading_places() -> None:
    """Two ranks of two micro-batches of 12 tokens, costs L**2: the text plan costs 101 | 123 and no sample
    of the costlier rank fits the other; trading a 7 for a 5 (and micro-batches) makes it 114 | 110."""
    lengths, model = np.array([7, 6, 7, 8, 1, 5]), CostModel(alpha=1.0, beta=0.0)
    text = plan_step(lengths, 2, 2, 12, model, tolerance=0.0)
    assert text.rank_totals(model.costs(lengths)).tolist() == [101.0, 123.0]
    kwargs = {"costs": model.costs(lengths), "patches": np.zeros(6, np.int64), "patch_capacity": 1}
    traded = plan_step(lengths, 2, 2, 12, model, tolerance=0.0, **kwargs)
    validate_plan(traded, lengths)
    np.testing.assert_array_equal(traded.placed_mask, text.placed_mask)
    assert traded.rank_totals(model.costs(lengths)).tolist() == [114.0, 110.0]


def test_the_patch_capacity_decides_where_tokens_would_allow_more() -> None:
    """Four samples of 10 tokens fit one micro-batch of 40 tokens, but their 30 patches each fit two by two:
    the two micro-batches take two each."""
    lengths, patches = np.full(4, 10), np.full(4, 30)
    plan = plan_step(lengths, 1, 2, 40, patches=patches, patch_capacity=60)
    assert plan.placed_mask.all() and np.bincount(plan.micro).tolist() == [2, 2]
    one = plan_step(lengths, 1, 1, 40, patches=patches, patch_capacity=60)
    assert one.placed_mask.sum() == 2 and one.deferred_indices.tolist() == [2, 3]


def test_a_start_over_the_patch_capacity_is_named() -> None:
    with pytest.raises(ValueError, match="start puts 80 patches in micro-batch 0, more than its patch capacity 60"):
        plan_step(np.full(2, 10), 1, 2, 40, patches=np.full(2, 40), patch_capacity=60, start=np.array([0, 0]))


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"costs": np.ones(3)}, r"costs must be numbers, one per sample \(2\)"),
        ({"costs": np.array([1.0, np.nan])}, r"costs must be finite and >= 0, got costs\[1\] = nan"),
        ({"costs": np.array([1.0, -1.0])}, r"costs\[1\] = -1.0"),
        ({"costs": np.array(["a", "b"])}, "costs must be numbers"),
        ({"patches": np.array([1, 2]), "patch_capacity": -1}, "patch_capacity must be an integer >= 0"),
        ({"patches": np.array([1.0, 2.0])}, "patches must be integers"),
        ({"patches": np.array([1, -2])}, r"patches\[1\] = -2"),
        ({"patches": np.array([1, 20]), "patch_capacity": 10}, r"patches\[1\] = 20 exceeds patch_capacity 10"),
    ],
)
def test_bad_multimodal_arguments_are_named(kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        plan_step(np.array([1, 2], np.int64), 2, 1, 10, **kwargs)


def test_validate_plan_catches_a_micro_batch_over_its_patches() -> None:
    plan = StepPlan(np.zeros(2, np.int32), np.zeros(2, np.int32), 1, 1, 10, patch_capacity=50)
    with pytest.raises(ValueError, match="holds 60 patches, over the patch capacity 50"):
        validate_plan(plan, np.array([1, 1]), np.array([30, 30]))
