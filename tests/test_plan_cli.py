"""`mixflow plan` end to end through pipeline.cli.main."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.scheduler import StepPlan, validate_plan


def _args(lengths: Path, out: Path, *extra: str) -> list[str]:
    return ["plan", "--lengths", str(lengths), "--ranks", "4", "--micro-batches", "2", "--capacity", "4096",
            "--out", str(out), *extra]  # fmt: skip


def test_plan_writes_assignment_and_summary(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    lengths = np.random.default_rng(0).integers(1, 2000, 40).astype(np.int64)
    np.save(tmp_path / "lengths.npy", lengths)
    assert main(_args(tmp_path / "lengths.npy", tmp_path / "plan.npz", "--alpha", "1", "--beta", "100")) == 0
    with np.load(tmp_path / "plan.npz") as saved:
        rank, micro = saved["rank"], saved["micro"]
    assert rank.dtype == np.int32 and micro.dtype == np.int32 and rank.shape == lengths.shape
    validate_plan(StepPlan(rank, micro, ranks=4, micro_batches=2, capacity=4096), lengths)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("samples=40 ")
    assert lines[-1].startswith("plan_seconds=") and float(lines[-1].split("=")[1]) >= 0


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        (None, (), "no such file"),
        (np.array([1.5, 2.0]), (), "int64"),
        (np.array([1, 5000], np.int64), (), "lengths[1] = 5000 exceeds capacity 4096"),
        (np.array([1, 2], np.int64), ("--alpha", "-1"), "alpha"),
    ],
)
def test_plan_errors_are_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture, content: np.ndarray | None, extra: tuple, message: str
) -> None:
    path = tmp_path / "lengths.npy"
    if content is not None:
        np.save(path, content)
    assert main(_args(path, tmp_path / "plan.npz", *extra)) == 2
    err = capsys.readouterr().err
    assert "mixflow plan: error:" in err and message in err and "Traceback" not in err
