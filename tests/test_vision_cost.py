"""The vision encoder's cost model (``pipeline.spec.cost.VisionCostModel``) and the spec fields of multimodal
steps: ``cost.vision`` and ``step.patches_per_micro_batch``."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.spec import SpecError, load_spec
from pipeline.spec.cost import CostModel, VisionCostModel
from tests.test_spec import _base, _problems


def test_from_vit_counts_the_flops_of_attention_within_an_item_and_of_the_linear_layers() -> None:
    model = VisionCostModel.from_vit(1280, 32)
    assert model.alpha == 4 * 1280 * 32 and model.beta == 24 * 1280**2 * 32 and model.gamma == 0
    # Non-causal: every pair of patches, as a non-causal transformer of the same shape.
    assert (model.alpha, model.beta) == (lambda m: (m.alpha, m.beta))(CostModel.from_transformer(1280, 32, False))
    for bad in ((0, 32), (1280, 0), (True, 2), (2.5, 2)):
        with pytest.raises(ValueError, match=r"hidden_size|num_layers"):
            VisionCostModel.from_vit(*bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gamma"):
        VisionCostModel(1.0, 1.0, gamma=float("nan"))


@settings(deadline=None, max_examples=80)
@given(
    st.lists(st.lists(st.integers(1, 20_000), max_size=5), max_size=30),
    st.sampled_from([(1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (163840.0, 1.2582912e9, 0.0), (2e-6, 0.01, 0.3)]),
)
def test_a_samples_encoder_cost_is_the_sum_over_its_items(items: list[list[int]], coefficients: tuple) -> None:
    """Attention is within each item, so two items cost less than one of both together; text costs 0."""
    model = VisionCostModel(*coefficients)
    flat = np.array([n for sample in items for n in sample], np.int64)
    costs = model.sample_costs(flat, np.array([len(sample) for sample in items]))
    assert costs.dtype == np.float64 and costs.shape == (len(items),)
    for cost, sample in zip(costs.tolist(), items, strict=True):
        expected = math.fsum(model.alpha * n * n + model.beta * n + model.gamma for n in sample)
        assert cost == pytest.approx(expected, rel=1e-12, abs=0.0)
        assert model.sample_cost(sample) == cost  # one sample alone: the same float, bit for bit
        if len(sample) > 1 and model.alpha > 0:
            assert cost < model.costs(np.array([sum(sample)]))[0] + model.gamma * (len(sample) - 1)


def test_sample_costs_names_a_mismatch() -> None:
    with pytest.raises(ValueError, match="3 items for samples holding 2"):
        VisionCostModel(1.0, 1.0).sample_costs(np.array([1, 2, 3]), np.array([1, 1]))


def _load(tmp_path: Path, spec: dict) -> object:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return load_spec(path)


def test_vision_cost_and_patch_budget_load(tmp_path: Path) -> None:
    spec = _base()
    spec["cost"] = {"hidden_size": 3584, "num_layers": 28, "vision": {"hidden_size": 1280, "num_layers": 32}}
    spec["step"]["patches_per_micro_batch"] = 16384
    loaded = _load(tmp_path, spec)
    assert loaded.step.patches_per_micro_batch == 16384
    assert loaded.cost.vision_cost_model() == VisionCostModel.from_vit(1280, 32)
    spec["cost"] = {"alpha": 1.0, "beta": 10.0, "vision": {"alpha": 2.0, "beta": 3.0, "gamma": 4.0}}
    assert _load(tmp_path, spec).cost.vision_cost_model() == VisionCostModel(2.0, 3.0, 4.0)
    del spec["cost"]["vision"], spec["step"]["patches_per_micro_batch"]
    loaded = _load(tmp_path, spec)
    assert loaded.cost.vision_cost_model() is None and loaded.step.patches_per_micro_batch is None


@pytest.mark.parametrize(
    ("cost", "step", "named"),
    [
        ({"alpha": 1.0, "beta": 10.0, "vision": {"alpha": 1.0}}, {}, "cost.vision.beta: required with alpha/beta"),
        (
            {"alpha": 1.0, "beta": 10.0, "vision": {"alpha": 1.0, "beta": 1.0, "num_layers": 2}},
            {},
            "cost.vision: give either alpha/beta or hidden_size/num_layers, not both",
        ),
        ({"alpha": 1.0, "beta": 10.0, "vision": {}}, {}, "cost.vision: give alpha and beta, or hidden_size"),
        (
            {"alpha": 1.0, "beta": 10.0, "vision": {"hidden_size": 1280, "num_layers": 32}},
            {},
            "cost.vision: give the encoder's cost in the form of the LLM's",
        ),
        ({"alpha": 1.0, "beta": 10.0, "vision": {"alpha": -1.0, "beta": 1.0}}, {}, "cost.vision.alpha"),
        ({"alpha": 1.0, "beta": 10.0, "vision": {"alpha": 1.0, "beta": 1.0, "delta": 1}}, {}, "cost.vision.delta"),
        ({"alpha": 1.0, "beta": 10.0}, {"patches_per_micro_batch": 0}, "step.patches_per_micro_batch"),
    ],
)
def test_mistakes_are_named_by_field(tmp_path: Path, cost: dict, step: dict, named: str) -> None:
    spec = _base()
    spec["cost"] = cost
    spec["step"].update(step)
    problems = "\n".join(_problems(tmp_path, spec))
    assert named in problems


def test_a_spec_error_is_a_spec_error(tmp_path: Path) -> None:
    spec = _base()
    spec["cost"]["vision"] = {"alpha": 1.0}
    with pytest.raises(SpecError):
        _load(tmp_path, spec)
