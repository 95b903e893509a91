"""The step core's plans of multimodal jobs, part by part, against each step's bound and against naive per-rank
loading, as ``benchmarks/part_balance_bench.py`` measures them (its steps and seeds, fewer families): jobs of several
sources where both parts can be even reach within 5% of each part's bound at the median, and at or below naive
loading (as a run over the job) at the 95th percentile, over both seeds' steps."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.part_balance_bench import FAMILIES, SHAPES, run_job


@pytest.mark.parametrize(
    ("family", "shape"),
    [("example-like", "2x2x1024"), ("chunks", "2x2x1024"), ("video", "2x2x1024"), ("big images", "3x2x2048"),
     ("long text", "3x2x2048"), ("chunks + big images", "3x2x2048"), ("chunks + big images", "8x2x2048"),
     ("documents", "8x2x2048")],
)  # fmt: skip
def test_each_part_is_near_its_bound_and_no_worse_than_naive_loading(family: str, shape: str) -> None:
    jobs = [run_job(FAMILIES[family], SHAPES[shape], steps=40, seed=seed) for seed in (0, 1)]
    planned, bound, run = (np.array([v for job in jobs for v in getattr(job, k)]) for k in ("planned", "bound", "run"))
    for col, part in enumerate(("encoder", "LLM")):
        over = float(np.median(planned[:, col] / bound[:, col]))
        assert over <= 1.05, f"{family} {shape} {part}: median {over:.3f} of its bound"
        high, naive = (float(np.percentile(x[:, col], 95)) for x in (planned, run))
        assert high <= naive + 1e-9, f"{family} {shape} {part}: p95 {high:.3f} against naive loading's {naive:.3f}"
