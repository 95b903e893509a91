"""benchmarks/gpu_bench.py's planned-steps part, run on the CPU with a tiny block, so that the script a GPU
lease runs once has run here first: the exported plans' format, the timing and the summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_exported_plans_are_timed_and_summarised(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from benchmarks import gpu_bench

    exported = tmp_path / "plans.json"
    export = ["--export-plans", str(exported), "--steps", "1", "--warm-up", "1", "--contexts", "8k"]
    subprocess.run(
        [sys.executable, "-m", "benchmarks.balance_sim_bench", *export],
        check=True,
        capture_output=True,
        timeout=120,
        cwd=REPO,
    )
    plans = json.loads(exported.read_text())
    entry = plans["contexts"]["8k"]
    for method in ("naive", "in-order", "composed"):
        (step,) = entry["methods"][method]["plans"]
        assert len(step) == plans["ranks"] and all(len(rank) == entry["micro_batches"] for rank in step)
        assert all(sum(mb) <= entry["capacity"] for rank in step for mb in rank)
    # A CPU cannot time 8k-token samples at this size in a test: keep two ranks of short samples.
    for method in entry["methods"].values():
        method["plans"] = [
            [[[min(n, 40) for n in mb[:6]] for mb in rank[:2]] for rank in step[:2]] for step in method["plans"]
        ]
    plans["ranks"] = 2
    out: dict = {}
    saved = []
    gpu_bench.planned_steps(
        plans,
        ["naive", "composed"],
        60.0,
        out,
        lambda: saved.append(True),
        device_name="cpu",
        shape=(32, 2),
        pad_multiples=(1, 16),
    )
    assert saved == [True]
    summary = out["8k"]["methods"]
    assert set(summary) == {"naive", "composed", "naive+pad16", "composed+pad16"}
    assert summary["composed+pad16"]["fill"] == summary["composed"]["fill"]
    for row in summary.values():
        assert row["steps"] == 1 and row["measured_tokens_per_s"] > 0 and row["measured_max_over_mean"] >= 1
    assert summary["naive"]["measured_vs_naive"] == summary["naive+pad16"]["measured_vs_naive"] == 1
