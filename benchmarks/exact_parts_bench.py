"""The planner's multimodal steps against the best plans of their samples, found exactly by a mixed-integer
program (HiGHS, through ``scipy.optimize.milp``: in the ``dev`` extra), on step shapes small enough to solve (a
few ranks of 2 micro-batches).

    .venv/bin/python -m benchmarks.exact_parts_bench [--families a,b] [--shapes 3x2x2048] [--steps 40]
        [--every 2] [--time-limit 15] [--markdown]

The steps are ``part_balance_bench``'s (its job families, drawn and planned by the constructor's step core), every
``--every``-th of ``--steps`` after the warm-up, one seed. For each, over every placement of its placed samples
that keeps both capacities of each micro-batch:

- **all parts at once**: the least ``z`` such that some placement holds every rank's encoder part, LLM part and
  total within ``z`` times their bounds (``largest_rank_bound``, each part's alone); the planner's figure is its
  largest part over that part's bound. ``z <= 1.05`` says each part within 5% of its bound is reachable on that
  step, which the bounds alone cannot say: each is of its part alone;
- **the step where each part waits for its slowest rank** (as FSDP's per-layer gathers make the encoder and the
  LLM do): the sum of the two parts' largest rank over the least any placement reaches.

A solve that reaches ``--time-limit`` gives the best placement it found or the planner's, the better (``z`` is then
an upper bound of the least); the table counts those steps.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from benchmarks._table import add_markdown_flag, print_table
from benchmarks.part_balance_bench import FAMILIES, LLM, SHAPES, run_job
from pipeline.planning.scheduler.part_bound import largest_rank_bound
from pipeline.planning.shape import StepShape
from pipeline.planning.step.core import PlannedStep


@dataclass(frozen=True)
class Least:
    """A solve: the best value found and whether it is proven least."""

    value: float
    proven: bool


@dataclass(frozen=True)
class StepSamples:
    """A planned step's placed samples and where the planner put them."""

    lengths: np.ndarray
    patches: np.ndarray
    encoder: np.ndarray
    rank: np.ndarray

    @classmethod
    def of(cls, planned: PlannedStep) -> StepSamples:
        placed = planned.plan.placed_mask
        rank = planned.plan.rank[placed].astype(np.int64)
        return cls(planned.lengths[placed], planned.patches[placed], planned.encoder_costs[placed], rank)


def least_largest(
    samples: StepSamples, parts: list[np.ndarray], weights: list[np.ndarray], shape: StepShape, time_limit: float
) -> Least:
    """The least sum of the variables ``z`` over every placement of ``samples`` on ``shape`` (each sample whole in one
    micro-batch, which holds at most its tokens and patches) where each rank's sum of ``parts[j]`` is at most
    ``weights[j] . z`` (``weights[j]``: one weight per variable). One variable weighted by each part's bound: all
    parts at once; one variable per part, weighted 1: the sum of the parts' largest ranks."""
    n, slots, count = samples.lengths.size, shape.ranks * shape.micro_batches, len(weights[0])
    variables = n * slots + count
    column = np.arange(n * slots).reshape(n, slots)
    rows, cols, values, low, high = [], [], [], [], []

    def add(row_cols: np.ndarray, row_values: np.ndarray, lo: float, hi: float) -> None:
        rows.append(np.full(row_cols.size, len(low)))
        cols.append(row_cols)
        values.append(row_values)
        low.append(lo)
        high.append(hi)

    for i in range(n):
        add(column[i], np.ones(slots), 1.0, 1.0)
    limits = [(samples.lengths, shape.tokens_per_micro_batch)]
    if shape.patches_per_micro_batch > 0:
        limits.append((samples.patches, shape.patches_per_micro_batch))
    for size, capacity in limits:
        for s in range(slots):
            add(column[:, s], size.astype(np.float64), 0.0, float(capacity))
    for part, weight in zip(parts, weights, strict=True):
        for r in range(shape.ranks):
            own = column[:, r * shape.micro_batches : (r + 1) * shape.micro_batches]
            row_cols = np.concatenate([own.reshape(-1), n * slots + np.arange(count)])
            row_values = np.concatenate([np.repeat(part, shape.micro_batches), -weight])
            add(row_cols, row_values, -math.inf, 0.0)
    matrix = coo_matrix(
        (np.concatenate(values), (np.concatenate(rows), np.concatenate(cols))), shape=(len(low), variables)
    )
    objective = np.concatenate([np.zeros(n * slots), np.ones(count)])
    upper = np.concatenate([np.ones(n * slots), np.full(count, np.inf)])
    integral = np.concatenate([np.ones(n * slots), np.zeros(count)])
    with _quiet_stdout():
        result = milp(
            objective,
            constraints=LinearConstraint(matrix.tocsr(), low, high),
            integrality=integral,
            bounds=Bounds(np.zeros(variables), upper),
            options={"time_limit": time_limit},
        )
    if result.x is None:
        raise RuntimeError(f"no placement found within {time_limit} s: {result.message}")
    return Least(float(result.fun), result.status == 0)


@contextmanager
def _quiet_stdout() -> Iterator[None]:
    """HiGHS writes some of its progress to the process's stdout whatever its options: into /dev/null."""
    sys.stdout.flush()
    saved = os.dup(1)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


@dataclass(frozen=True)
class StepFigures:
    planned_parts: float  # the planner's largest part over its bound
    least_parts: Least  # z: all parts at once, over their bounds
    planned_sum: float  # the planner's largest encoder rank + largest LLM rank, over the mean total
    least_sum: Least  # the least of that sum


def step_figures(samples: StepSamples, shape: StepShape, time_limit: float) -> StepFigures:
    ranks = shape.ranks
    llm = LLM.costs(samples.lengths)
    scale = float(llm.sum() + samples.encoder.sum()) / ranks  # the mean rank's total: every part in its units
    parts = [samples.encoder / scale, llm / scale]
    parts.append(parts[0] + parts[1])
    bounds = [largest_rank_bound(p, samples.lengths, samples.patches, shape) for p in parts]
    per_rank = [np.bincount(samples.rank, weights=p, minlength=ranks) for p in parts]
    planned_parts = max(float(r.max()) / b for r, b in zip(per_rank, bounds, strict=True) if b > 0)
    at_once = least_largest(samples, parts, [np.array([b]) for b in bounds], shape, time_limit)
    summed = least_largest(samples, parts[:2], [np.array([1.0, 0.0]), np.array([0.0, 1.0])], shape, time_limit)
    planned_sum = float(per_rank[0].max() + per_rank[1].max())
    # the planner's placement is one of them: a solve stopped by its time limit may have found none as good
    at_once = Least(min(at_once.value, planned_parts), at_once.proven)
    summed = Least(min(summed.value, planned_sum), summed.proven)
    return StepFigures(planned_parts, at_once, planned_sum, summed)


def rows_of(name: str, shape_name: str, steps: int, every: int, time_limit: float) -> list[str]:
    shape = SHAPES[shape_name]
    observed: list[StepSamples] = []
    run_job(FAMILIES[name], shape, steps, 0, lambda planned: observed.append(StepSamples.of(planned)))
    figures = [step_figures(samples, shape, time_limit) for samples in observed[::every]]
    planned_parts = np.array([f.planned_parts for f in figures])
    least_parts = np.array([f.least_parts.value for f in figures])
    sum_over = np.array([f.planned_sum / f.least_sum.value for f in figures])
    unproven = sum(not (f.least_parts.proven and f.least_sum.proven) for f in figures)
    return [
        name,
        shape_name,
        str(len(figures)),
        f"{np.median(planned_parts):.3f}",
        f"{np.median(least_parts):.3f}",
        f"{np.mean(least_parts <= 1.05):.2f}",
        f"{np.mean(planned_parts <= 1.05):.2f}",
        f"{np.median(sum_over):.3f}",
        f"{np.percentile(sum_over, 95):.3f}",
        str(unproven),
    ]


HEADER = [
    "family",
    "shape",
    "steps",
    "planned: largest part over bound (median)",
    "least z (median)",
    "steps z <= 1.05",
    "steps planned <= 1.05",
    "sum of part maxima over least (median)",
    "(p95)",
    "steps at the time limit",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="chunks + big images,chunks,big images,documents")
    parser.add_argument("--shapes", default="3x2x2048")
    parser.add_argument("--steps", type=int, default=40, help="steps of each job after the warm-up")
    parser.add_argument("--every", type=int, default=2, help="solve every N-th step")
    parser.add_argument("--time-limit", type=float, default=15.0, help="seconds a solve, at most")
    add_markdown_flag(parser)
    args = parser.parse_args()
    table = [
        rows_of(name, shape, args.steps, args.every, args.time_limit)
        for name in args.families.split(",")
        for shape in args.shapes.split(",")
    ]
    print_table(HEADER, table, markdown=args.markdown)


if __name__ == "__main__":
    main()
