"""The step core with multimodal samples: windows that carry each sample's vision patches and encoder cost,
the constructor's pool handing them over from ``Sample.media``, plans under both capacities, the per-rank
LLM and encoder costs of a planned step, and composition's packing kept within the patch budget. No Kafka."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.planning.mixing import DrawStatus, Mixer, MixerState, Schedule, step_budget
from pipeline.planning.mixing.mixer import Composition
from pipeline.planning.scheduler import CostModel, validate_plan, within_patch_capacity
from pipeline.planning.shape import StepShape
from pipeline.planning.step.assemble import assemble_planned
from pipeline.planning.step.core import StepCore, StepWindow
from pipeline.planning.step.pool import SamplePool
from pipeline.planning.step.spec_change import check_step_shape
from pipeline.planning.step.state import ConstructorState
from pipeline.spec.cost import VisionCostModel
from tests.multimodal_families import FAMILIES, Multimodal, draw_multimodal
from topics.errors import MixflowError
from topics.formats.media import MediaItem
from topics.formats.sample import Sample

VISION = VisionCostModel(alpha=1e-3, beta=0.5)


def _item(patches: int) -> MediaItem:
    """An image of ``patches`` patches (a 2 x patches/2 grid of 1-pixel patches: tiny raw frames)."""
    h, w = 2, patches // 2
    return MediaItem("image", 1, h, w, 2, 2, h, w, 0, "raw", (bytes(h * w * 3),))


def _mixer(weights: dict[str, float], shape: StepShape, cost_model: CostModel, composed: bool) -> Mixer:
    composition = None
    if composed:
        composition = Composition(shape, cost_model, 2.0, 0.5)
    schedule = Schedule(list(weights), [0], [list(weights.values())])
    return Mixer(schedule, step_budget(shape.tokens_per_step), composition=composition)


def _check_patches(planned: object, shape: StepShape) -> None:
    plan, patches = planned.plan, planned.patches
    if patches is not None and shape.patches_per_micro_batch:
        validate_plan(plan, planned.lengths, patches)


@settings(deadline=None, max_examples=20)
@given(
    st.sampled_from(FAMILIES),
    st.sampled_from([StepShape(2, 2, 256, 512), StepShape(4, 1, 512, 512), StepShape(3, 4, 300, 1200)]),
    st.lists(st.floats(0.1, 1.0), min_size=1, max_size=3),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_the_pool_of_multimodal_samples_and_arrays_of_ids_make_the_same_steps(
    family: str, shape: StepShape, raw: list[float], composed: bool, seed: int
) -> None:
    """The constructor's ``SamplePool`` of ``Sample`` objects with media and the simulator's arrays (lengths,
    patches and encoder costs by id) make the same steps, every plan within both capacities, and a step's
    per-rank LLM and encoder costs add up to what the scheduler balanced."""
    rng = np.random.default_rng(seed)
    weights = {f"s{k}": w for k, w in enumerate(raw)}
    cost_model = CostModel(alpha=3.0 / shape.tokens_per_micro_batch, beta=1.0)
    mixer = _mixer(weights, shape, cost_model, composed)
    core = StepCore(shape, cost_model, vision=VISION)
    pool = SamplePool(ConstructorState.initial(MixerState.initial(weights)), core.vision)
    ids = {s: np.zeros(0, np.int64) for s in weights}
    lengths_of: list[int] = []
    patches_of: list[int] = []
    encoder_of: list[float] = []
    offsets = dict.fromkeys(weights, 0)
    deferred = np.zeros(0, np.int64)
    state = mixer.initial_state()
    for _ in range(5):
        for k, s in enumerate(weights):
            count = int(rng.integers(0, 4 * shape.ranks * shape.micro_batches + 2))
            drawn = draw_multimodal(family, rng, count, shape.tokens_per_micro_batch, shape.patches_per_micro_batch)
            first_item = 0
            for length, n_items in zip(drawn.lengths.tolist(), drawn.items.tolist(), strict=True):
                items = drawn.item_patches[first_item : first_item + n_items]
                first_item += n_items
                media = tuple(_item(int(p)) for p in items)
                pool.add(s, offsets[s], Sample(str(len(lengths_of)), s, np.full(length, k, np.int32), media=media))
                offsets[s] += 1
                ids[s] = np.append(ids[s], len(lengths_of))
                lengths_of.append(length)
                patches_of.append(int(items.sum()))
                encoder_of.append(float(VISION.sample_costs(items, np.array([n_items]))[0]))
        lengths, patches, encoder = np.array(lengths_of), np.array(patches_of), np.array(encoder_of)
        window = pool.window()
        if window.patches is not None:
            for s in weights:
                np.testing.assert_array_equal(window.patches[s], patches[ids[s]])
                np.testing.assert_array_equal(window.encoder_costs[s], encoder[ids[s]])
            np.testing.assert_array_equal(window.deferred_patches, patches[deferred])
            np.testing.assert_array_equal(window.deferred_encoder_costs, encoder[deferred])
        by_ids = StepWindow(
            {s: lengths[ids[s]] for s in weights},
            window.deferred_source,
            lengths[deferred],
            {s: patches[ids[s]] for s in weights},
            {s: encoder[ids[s]] for s in weights},
            patches[deferred],
            encoder[deferred],
        )
        outcome = core.next_step(mixer, state, window)
        again = core.next_step(mixer, state, by_ids)
        if outcome.status is not DrawStatus.OK:
            assert again.status is outcome.status
            continue
        planned, planned_by_ids = outcome.planned, again.planned
        assert planned is not None and planned_by_ids is not None
        np.testing.assert_array_equal(planned.plan.rank, planned_by_ids.plan.rank)
        np.testing.assert_array_equal(planned.plan.micro, planned_by_ids.plan.micro)
        validate_plan(planned_by_ids.plan, planned_by_ids.lengths, planned_by_ids.patches)
        candidates = planned_by_ids.candidates_of(deferred, ids)
        np.testing.assert_array_equal(planned_by_ids.patches, patches[candidates])
        llm, vision = planned_by_ids.llm_rank_costs(cost_model), planned_by_ids.encoder_rank_costs()
        placed = planned_by_ids.plan.placed_mask
        total = cost_model.costs(lengths[candidates]) + encoder[candidates]
        assert (llm + vision).sum() == pytest.approx(total[placed].sum(), rel=1e-9)
        assert planned_by_ids.rank_patches().sum() == patches[candidates][placed].sum()
        for s in weights:
            ids[s] = np.delete(ids[s], planned.taken[s])
        taken = pool.take(planned.taken, planned.order)
        assert [int(c.sample.sample_id) for c in taken] == candidates.tolist()
        assembled = assemble_planned(planned, taken)
        pool.settle(assembled.delivered, assembled.deferred)
        deferred = candidates[~planned.plan.placed_mask]
        state = planned.next_state


@settings(deadline=None, max_examples=30)
@given(st.sampled_from(["text", "mixed"]), st.integers(0, 2**16), st.booleans())
def test_a_window_without_media_plans_as_text(family: str, seed: int, composed: bool) -> None:
    """Patches and encoder costs all 0 (a multimodal job's text-only step) give the text plan, bit for bit;
    so do samples with patches but no encoder cost and no patch budget."""
    rng = np.random.default_rng(seed)
    shape = StepShape(3, 2, 256)
    cost_model = CostModel(alpha=0.01, beta=1.0)
    weights = {"a": 0.6, "b": 0.4}
    mixer = _mixer(weights, shape, cost_model, composed)
    available = {s: draw_multimodal(family, rng, 120, 256, 1024) for s in weights}
    text = StepWindow({s: m.lengths for s, m in available.items()}, np.zeros(0, np.int64), np.zeros(0, np.int64))
    zeros = {s: np.zeros(len(m.lengths)) for s, m in available.items()}
    with_patches = StepWindow(
        text.available, text.deferred_source, text.deferred_lengths, {s: m.patches for s, m in available.items()}, zeros
    )
    state = mixer.initial_state()
    expected = StepCore(shape, cost_model).next_step(mixer, state, text).planned
    got = StepCore(shape, cost_model, vision=VISION).next_step(mixer, state, with_patches).planned
    assert expected is not None and got is not None
    np.testing.assert_array_equal(expected.plan.rank, got.plan.rank)
    np.testing.assert_array_equal(expected.plan.micro, got.plan.micro)
    assert got.encoder_rank_costs().sum() == 0


def _window(samples: Multimodal, vision: VisionCostModel) -> StepWindow:
    empty = np.zeros(0, np.int64)
    encoder = vision.sample_costs(samples.item_patches, samples.items)
    return StepWindow({"a": samples.lengths}, empty, empty, {"a": samples.patches}, {"a": encoder}, empty, empty[:0])


def test_composed_steps_keep_the_patch_budget() -> None:
    """Composition chooses by length; where its packing puts more patches in a micro-batch than the budget,
    the plan keeps the budget all the same."""
    shape = StepShape(4, 2, 512, 600)
    cost_model = CostModel(alpha=1.0 / 512, beta=1.0)
    mixer = _mixer({"a": 1.0}, shape, cost_model, composed=True)
    core = StepCore(shape, cost_model, vision=VISION)
    samples = draw_multimodal("image-heavy", np.random.default_rng(2), 400, 512, 600)
    planned = core.next_step(mixer, MixerState.initial(["a"]), _window(samples, VISION)).planned
    assert planned is not None and planned.started  # planned from a packing that held too many patches
    validate_plan(planned.plan, planned.lengths, planned.patches)
    assert planned.plan.patch_capacity == 600


def test_a_start_over_the_patch_budget_loses_its_newest_samples_with_patches() -> None:
    start = np.array([0, 0, 0, 0, 1, -1])
    patches = np.array([30, 0, 30, 0, 50, 40])
    kept = within_patch_capacity(start, patches, 2, 40)
    assert kept.tolist() == [0, 0, -1, 0, -1, -1]  # the text samples stay, the newest image of each leaves
    assert within_patch_capacity(start, patches, 2, 100) is start


def test_a_resumed_job_may_change_its_patch_budget_but_not_its_shape() -> None:
    check_step_shape(StepShape(2, 2, 256), StepShape(2, 2, 256, 4096), "j")
    with pytest.raises(MixflowError, match=r"step\.ranks is 3 in the spec but 2"):
        check_step_shape(StepShape(2, 2, 256), StepShape(3, 2, 256, 4096), "j")


def test_multimodal_balance_simulator_smoke() -> None:
    """``python -m benchmarks.multimodal_balance_bench --quick`` runs and prints its table and target lines."""
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.multimodal_balance_bench", "--quick", "--markdown"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert result.returncode == 0, result.stderr
    assert "| 4 x 8k  | 4 x 8192, 16384         | composed " in result.stdout
    assert "target met: 4 x 8k composed: median max/mean encoder <= 1.05" in result.stdout


def test_multimodal_balance_simulator_runs_a_vlm_stream_at_other_ranks() -> None:
    command = [sys.executable, "-m", "benchmarks.multimodal_balance_bench", "--ranks", "3", "--stream", "vlm"]
    command += ["--contexts", "4 x 8k / 32k patches", "--methods", "naive,composed", "--steps", "3", "--warm-up", "1"]
    command += ["--seeds", "1", "--markdown"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent.parent)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| 4 x 8k / 32k patches")]
    assert [row.split("|")[3].strip() for row in rows] == ["naive", "composed"], result.stdout
    assert "R = 3, stream vlm" in result.stdout


@settings(deadline=None, max_examples=20)
@given(st.sampled_from(["text", "image-heavy", "mixed"]), st.integers(0, 2**16))
def test_composition_scores_its_options_with_the_plan_the_step_gets(family: str, seed: int) -> None:
    """With the window's media, composition scores each option with ``plan_with_media`` (true costs, both
    capacities): for samples without media that is the text plan, so the draw is the one without media;
    with media the draw is valid and the step is planned within both capacities."""
    rng = np.random.default_rng(seed)
    shape = StepShape(3, 2, 512, 1024)
    cost_model = CostModel(alpha=1.0 / 512, beta=1.0)
    mixer = _mixer({"a": 0.7, "b": 0.3}, shape, cost_model, composed=True)
    empty = np.zeros(0, np.int64)
    samples = {s: draw_multimodal(family, rng, 200, 512, 1024) for s in ("a", "b")}
    encoder = {s: VISION.sample_costs(m.item_patches, m.items) for s, m in samples.items()}
    lengths = {s: m.lengths for s, m in samples.items()}
    window = StepWindow(lengths, empty, empty, {s: m.patches for s, m in samples.items()}, encoder, empty, empty[:0])
    core = StepCore(shape, cost_model, vision=VISION)
    state = MixerState.initial(["a", "b"])
    with_media = core.draw(mixer, state, window)
    without = core.draw(mixer, state, StepWindow(lengths, empty, empty))
    assert with_media.status is DrawStatus.OK
    if family == "text":
        assert all(np.array_equal(with_media.take[s], without.take[s]) for s in lengths)
    planned = core.plan(with_media, window).planned
    assert planned is not None
    validate_plan(planned.plan, planned.lengths, planned.patches)
