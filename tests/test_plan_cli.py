"""`mixflow plan` end to end through pipeline.cli.main."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.cli.plan_context_parallel import read_cost_section
from pipeline.planning.scheduler import CostModel, StepPlan, plan_step, validate_plan
from pipeline.planning.scheduler.context_parallel import CPMode, CPPlan, CPShape, plan_cp_step, validate_cp_plan


def _args(lengths: Path, out: Path, *extra: str) -> list[str]:
    return [
        "plan",
        "--lengths",
        str(lengths),
        "--ranks",
        "4",
        "--micro-batches",
        "2",
        "--capacity",
        "4096",
        "--out",
        str(out),
        *extra,
    ]


def test_plan_writes_assignment_and_summary(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    lengths = np.random.default_rng(0).integers(1, 2000, 40).astype(np.int64)
    np.save(tmp_path / "lengths.npy", lengths)
    assert main(_args(tmp_path / "lengths.npy", tmp_path / "plan.npz", "--alpha", "1", "--beta", "100")) == 0
    with np.load(tmp_path / "plan.npz") as saved:
        rank, micro = saved["rank"], saved["micro"]
    assert rank.dtype == np.int32 and micro.dtype == np.int32 and rank.shape == lengths.shape
    validate_plan(StepPlan(rank, micro, ranks=4, micro_batches=2, capacity=4096), lengths)
    # The file holds the scheduler's plan for the arguments given (ranks, micro-batches, capacity, alpha, beta).
    expected = plan_step(lengths, 4, 2, 4096, CostModel(alpha=1.0, beta=100.0))
    np.testing.assert_array_equal(rank, expected.rank)
    np.testing.assert_array_equal(micro, expected.micro)

    # The summary printed describes the plan in the file, recomputed here from it with numpy alone: about
    # 39k tokens for 32k of capacity, so some samples wait, and costs are exact integers in float64.
    placed = rank >= 0
    assert 0 < placed.sum() < lengths.size
    costs = lengths.astype(np.float64) ** 2 + 100 * lengths
    micro_costs = np.zeros((4, 2))
    np.add.at(micro_costs, (rank[placed], micro[placed]), costs[placed])
    rank_costs = micro_costs.sum(axis=1)
    busy = rank_costs > 0
    micro_imbalance = (micro_costs[busy].max(axis=1) / (rank_costs[busy] / 2)).max()
    lower_bound = max(costs[placed].sum() / 4, costs[placed].max())
    tokens = int(lengths[placed].sum())
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[:-1] == [
        f"samples=40 placed={placed.sum()} deferred={(~placed).sum()}",
        f"tokens placed={tokens} / capacity=32768 ({tokens / 32768:.2%})",
        f"max rank cost={rank_costs.max():.6g} / lower bound={lower_bound:.6g}"
        f" (ratio {rank_costs.max() / lower_bound:.4f})",
        f"micro-batch imbalance={micro_imbalance:.4f}",
    ]
    assert re.fullmatch(r"plan_seconds=\d+\.\d{6}", lines[-1]), lines[-1]


@pytest.mark.parametrize(
    ("content", "extra", "message", "code"),
    [
        (None, (), "no such file", 4),
        (np.array([1.5, 2.0]), (), "int64", 2),
        (np.array([1, 5000], np.int64), (), "lengths[1] = 5000 exceeds capacity 4096", 2),
        (np.array([1, 2], np.int64), ("--alpha", "-1"), "alpha", 2),
    ],
)
def test_plan_errors_are_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture, content: np.ndarray | None, extra: tuple, message: str, code: int
) -> None:
    path = tmp_path / "lengths.npy"
    if content is not None:
        np.save(path, content)
    assert main(_args(path, tmp_path / "plan.npz", *extra)) == code
    err = capsys.readouterr().err
    assert "mixflow plan: error:" in err and message in err and "Traceback" not in err


def _cp_args(lengths: Path, out: Path, mode: str, *extra: str) -> list[str]:
    return [
        "plan",
        "--lengths",
        str(lengths),
        "--ranks",
        "8",
        "--micro-batches",
        "2",
        "--max-tokens-per-rank",
        "2048",
        "--context-parallel",
        mode,
        "--out",
        str(out),
        *extra,
    ]


COST_SECTION = """
cost:
  hidden_size: 1024
  num_layers: 8
  context_parallel: {kv_heads: 4, head_dim: 64, tflops: 100, nvlink_gb_s: 200, network_gb_s: 20, ranks_per_node: 4}
"""


@pytest.mark.parametrize(
    ("mode", "shape_mode", "size"),
    [
        ("static:4", "static", 4),
        ("aligned", "aligned", 8),
        ("aligned:4", "aligned", 4),
        ("free", "free", 8),
        ("free:6", "free", 6),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_plan_context_parallel_writes_the_planners_blocks(
    tmp_path: Path, capsys: pytest.CaptureFixture, mode: str, shape_mode: str, size: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(600), 1.3, 80), 1, 7000).astype(np.int64)
    lengths[rng.integers(0, 80)] = 7000  # a sample that must span 4 ranks or more
    np.save(tmp_path / "lengths.npy", lengths)
    (tmp_path / "spec.yaml").write_text(COST_SECTION)
    args = _cp_args(tmp_path / "lengths.npy", tmp_path / "plan.npz", mode, "--cost", str(tmp_path / "spec.yaml"))
    assert main(args) == 0
    with np.load(tmp_path / "plan.npz") as saved:
        rank, micro, cp = saved["rank"], saved["micro"], saved["cp"]
    shape = CPShape(8, 2, 2048, CPMode(shape_mode), size)
    cost = read_cost_section(tmp_path / "spec.yaml").context_parallel_cost()
    assert cost.kv_heads == 4 and cost.ranks_per_node == 4 and cost.flops_per_s == 100e12
    expected = plan_cp_step(lengths, shape, cost)
    np.testing.assert_array_equal(rank, expected.rank)
    np.testing.assert_array_equal(micro, expected.micro)
    np.testing.assert_array_equal(cp, expected.cp)
    validate_cp_plan(CPPlan(rank, cp, micro, shape), lengths)
    placed = rank >= 0
    if shape_mode != "free":
        assert ((rank[placed] % cp[placed]) == 0).all() and (cp[placed] & (cp[placed] - 1) == 0).all()
    out = capsys.readouterr().out
    assert f"samples=80 placed={placed.sum()} deferred={(~placed).sum()}" in out
    sizes = " ".join(f"{c}x{(cp[placed] == c).sum()}" for c in sorted(set(cp[placed].tolist())))
    assert f"cp sizes: {sizes}\n" in out
    assert f"tokens/s={expected.tokens_per_second(lengths, cost):.6g}\n" in out


@pytest.mark.parametrize(
    ("mode", "extra", "message"),
    [
        ("static", (), "static needs its size"),
        ("ring:4", (), "the mode is static:C, aligned[:C] or free[:C]"),
        ("aligned:3", (), "must be a power of two"),
        ("free:9", (), "more than the step's 8 ranks"),
        ("aligned:2", (), "lengths[3] = 9000 does not fit a block: on 2 ranks (aligned mode)"),
        ("free", ("--alpha", "2"), "give --cost or --alpha/--beta, not both"),
    ],
)
def test_plan_context_parallel_errors_are_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture, mode: str, extra: tuple, message: str
) -> None:
    np.save(tmp_path / "lengths.npy", np.array([10, 900, 30, 9000], np.int64))
    (tmp_path / "cost.yaml").write_text("hidden_size: 1024\nnum_layers: 4\n")
    args = _cp_args(tmp_path / "lengths.npy", tmp_path / "plan.npz", mode, "--cost", str(tmp_path / "cost.yaml"))
    assert main([*args, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("hidden_size: 1024\nnum_layers: 4\ncontext_parallel: {kv_heads: 0}\n", "cost.context_parallel.kv_heads"),
        ("cost: [1, 2]\n", "must hold a cost section"),
        ("alpha: 1\nbeta: 2\nwarp: 3\n", "cost.warp"),
    ],
)
def test_a_bad_cost_file_is_refused_with_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture, content: str, message: str
) -> None:
    np.save(tmp_path / "lengths.npy", np.array([10, 900], np.int64))
    (tmp_path / "cost.yaml").write_text(content)
    assert main(_args(tmp_path / "lengths.npy", tmp_path / "plan.npz", "--cost", str(tmp_path / "cost.yaml"))) == 2
    assert message in capsys.readouterr().err


def test_a_cost_file_plans_a_step_without_context_parallelism_by_its_model(tmp_path: Path) -> None:
    lengths = np.random.default_rng(3).integers(1, 2000, 40).astype(np.int64)
    np.save(tmp_path / "lengths.npy", lengths)
    (tmp_path / "cost.yaml").write_text("alpha: 1\nbeta: 100\n")
    assert main(_args(tmp_path / "lengths.npy", tmp_path / "plan.npz", "--cost", str(tmp_path / "cost.yaml"))) == 0
    expected = plan_step(lengths, 4, 2, 4096, CostModel(alpha=1.0, beta=100.0))
    with np.load(tmp_path / "plan.npz") as saved:
        np.testing.assert_array_equal(saved["rank"], expected.rank)
        assert "cp" not in saved.files
