"""The arrays a step's plan is made of, as the kernels pass them: the candidates in sorted order, the step's
shape, and a placement with the totals it implies.

Position ``k`` of the sorted candidates holds sample ``order[k]``, longest first (``_sort.py``); ``at[k]`` is
where it goes, ``rank << shift | micro_batch``, or -1 while deferred. Rank ``r``'s micro-batch ``m`` lives at
flat position ``r * micro + m`` of the per-micro-batch arrays.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pipeline.planning.kernels.jit import kernel


class Candidates(NamedTuple):
    order: np.ndarray  # int64, position -> sample
    length: np.ndarray  # int32
    cost: np.ndarray  # float64


class Grid(NamedTuple):
    ranks: int
    micro: int  # micro-batches a rank
    capacity: int  # tokens a micro-batch
    shift: int  # bits of ``at`` that hold the micro-batch


class Placement(NamedTuple):
    at: np.ndarray  # int32 or int64 (``at_dtype``)
    rank_cost: np.ndarray  # float64 by rank
    tokens: np.ndarray  # int64 by micro-batch
    micro_cost: np.ndarray  # float64 by micro-batch


@kernel
def copy_of(plan: Placement) -> Placement:
    return Placement(plan.at.copy(), plan.rank_cost.copy(), plan.tokens.copy(), plan.micro_cost.copy())


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
