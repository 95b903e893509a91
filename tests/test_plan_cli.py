"""`mixflow plan` end to end through pipeline.cli.main."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.planning.scheduler import CostModel, StepPlan, plan_step, validate_plan


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
