"""The arrays a step's plan is made of, as the kernels pass them: the samples as given, the candidates in
sorted order, the step's shape, and a placement with the totals it implies.

Position ``k`` of the sorted candidates holds sample ``order[k]``, longest first (``_sort.py``), or costliest
first where the step has two capacities; ``at[k]`` is where it goes, ``rank << shift | micro_batch``, or -1
while deferred. Rank ``r``'s micro-batch ``m`` lives at flat position ``r * micro + m`` of the
per-micro-batch arrays.

**Two capacities.** A step of multimodal samples bounds each micro-batch's tokens and its vision patches
(``Grid.patch_capacity > 0``): every fit tests both, the candidates are ordered by cost (which no longer
follows length), and the guarantee against starvation is on both (``_repair_two.py``). With
``patch_capacity == 0`` (text) the patches are empty arrays that no kernel reads, and a plan is made on
tokens alone.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pipeline.planning.kernels.jit import kernel


class Samples(NamedTuple):
    """The step's samples in priority order, as ``plan_step`` checked them."""

    lengths: np.ndarray  # int64
    costs: np.ndarray  # float64
    patches: np.ndarray  # int64; empty with one capacity
    encoder: np.ndarray  # float64: the vision encoder's part of ``costs``; empty where not given


class Candidates(NamedTuple):
    order: np.ndarray  # int64, position -> sample
    length: np.ndarray  # int32
    cost: np.ndarray  # float64
    patches: np.ndarray  # int64; empty with one capacity
    encoder: np.ndarray  # float64; empty where not given


class Grid(NamedTuple):
    ranks: int
    micro: int  # micro-batches a rank
    capacity: int  # tokens a micro-batch
    shift: int  # bits of ``at`` that hold the micro-batch
    patch_capacity: int = 0  # patches a micro-batch; 0: one capacity (tokens)


class Placement(NamedTuple):
    at: np.ndarray  # int32 or int64 (``at_dtype``)
    rank_cost: np.ndarray  # float64 by rank
    tokens: np.ndarray  # int64 by micro-batch
    micro_cost: np.ndarray  # float64 by micro-batch
    patches: np.ndarray  # int64 by micro-batch (0 with one capacity)


@kernel
def copy_of(plan: Placement) -> Placement:
    return Placement(
        plan.at.copy(), plan.rank_cost.copy(), plan.tokens.copy(), plan.micro_cost.copy(), plan.patches.copy()
    )


@kernel(inline="always")
def flat_slot(grid: Grid, at: np.int64) -> np.int64:
    """The flat micro-batch position of a placed ``at``."""
    return (at >> grid.shift) * grid.micro + (at & ((1 << grid.shift) - 1))


@kernel(inline="always")
def move_tokens(plan: Placement, rank: np.int64, slot: np.int64, tokens: np.int64, cost: float) -> None:
    """Add ``tokens`` and ``cost`` (either may be negative) to micro-batch ``slot`` and its ``rank``."""
    plan.tokens[slot] += tokens
    plan.micro_cost[slot] += cost
    plan.rank_cost[rank] += cost


@kernel(inline="always")
def move_patches(plan: Placement, grid: Grid, slot: np.int64, cands: Candidates, k: np.int64, sign: int) -> None:
    """Add ``sign`` times candidate ``k``'s patches to micro-batch ``slot`` (nothing with one capacity)."""
    if grid.patch_capacity > 0:
        plan.patches[slot] += sign * cands.patches[k]


@kernel(inline="always")
def fits_slot(plan: Placement, grid: Grid, slot: np.int64, length: np.int64, patches: np.int64) -> bool:
    """Whether micro-batch ``slot`` has room for ``length`` tokens and ``patches`` patches."""
    return plan.tokens[slot] + length <= grid.capacity and (
        grid.patch_capacity == 0 or plan.patches[slot] + patches <= grid.patch_capacity
    )
