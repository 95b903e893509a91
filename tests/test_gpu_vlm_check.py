"""benchmarks/gpu_vlm_check.py, run here with tiny sizes so that the script a GPU lease runs once has run first:
its plans keep both budgets of every micro-batch, and the whole check runs where pydantic is missing (the GPU
image) and reports every method."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import gpu_vlm_check as check
from pipeline.planning.scheduler import CostModel
from pipeline.spec.cost import VisionCostModel

REPO = Path(__file__).resolve().parent.parent


def _placed(plan: check.Plan) -> list[int]:
    return [i for rank in plan for micro_batch in rank for i in micro_batch]


def _assert_within_budgets(plans: list[check.Plan], stream: check.Stream, sizes: check.Sizes) -> None:
    patches = stream.patches
    for plan in plans:
        assert len(plan) == sizes.ranks and all(len(rank) == sizes.micro_batches for rank in plan)
        for micro_batch in (mb for rank in plan for mb in rank):
            assert stream.lengths[micro_batch].sum() <= sizes.tokens
            assert patches[micro_batch].sum() <= sizes.patches
    placed = [i for plan in plans for i in _placed(plan)]
    assert len(placed) == len(set(placed)), "a sample placed twice"


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    ranks=st.sampled_from([2, 8]),
    micro_batches=st.integers(1, 3),
    patches=st.sampled_from([256, 512, 2048]),
)
def test_every_method_keeps_both_budgets(seed: int, ranks: int, micro_batches: int, patches: int) -> None:
    sizes = replace(check.SMOKE, ranks=ranks, micro_batches=micro_batches, patches=patches, steps=3)
    stream = check.make_stream(sizes, 60 * ranks * micro_batches, np.random.default_rng(seed))
    assert np.all(stream.lengths <= sizes.tokens) and np.all(stream.patches <= sizes.patches)
    assert all(np.all(item % sizes.merge == 0) for item in stream.items)
    llm, vision = CostModel(2e-5, 2e-3, 0.01), VisionCostModel(1e-5, 1e-3, 0.01)

    naive = check.naive_plans(stream, sizes, sizes.steps)
    _assert_within_budgets(naive, stream, sizes)
    for plan in naive:
        for rank, micro_batches_of_rank in enumerate(plan):
            assert all(i % ranks == rank for mb in micro_batches_of_rank for i in mb)
    # Each rank takes its samples in arrival order, none skipped.
    for rank in range(ranks):
        taken = sorted(i for plan in naive for mb in plan[rank] for i in mb)
        assert taken == list(range(rank, rank + ranks * len(taken), ranks))

    for with_vision in (vision, None):
        plans = check.mixflow_plans(stream, sizes, sizes.steps, llm, with_vision)
        _assert_within_budgets(plans, stream, sizes)
        placed = [i for plan in plans for i in _placed(plan)]
        assert placed and max(placed) < len(stream.lengths)


def test_the_check_runs_without_pydantic_and_reports_every_method(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = (
        "import sys; sys.modules['pydantic'] = None; "  # as on the GPU image: no pydantic
        "from benchmarks.gpu_vlm_check import main; "
        f"sys.exit(main(['--smoke', '--out', {str(tmp_path)!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "results.json").read_text())

    assert set(result["methods"]) == set(check.METHODS)
    for method, row in result["methods"].items():
        assert row["steps"] == check.SMOKE.steps, method
        assert row["max_over_mean"] >= 1 and row["predicted_max_over_mean"] >= 1
        assert row["tokens_per_s"] > 0 and row["patches_per_s"] > 0
        assert row["measured_over_predicted_p10"] <= row["measured_over_predicted_median"]
    assert result["methods"]["naive"]["tokens_per_s_vs_naive"] == 1
    for method in check.METHODS:
        assert f"{method} " in done.stdout and "tokens/s" in done.stdout

    # (a)'s section is the spec's cost section with its vision part, in the fits' numbers.
    cost = yaml.safe_load(result["cost_section"])["cost"]
    assert set(cost) == {"alpha", "beta", "gamma", "vision"}
    assert cost["vision"]["beta"] == pytest.approx(result["fits"]["vision"]["beta"], rel=1e-3, abs=1e-12)
    assert cost["beta"] == pytest.approx(result["fits"]["llm"]["beta"], rel=1e-3, abs=1e-12)
