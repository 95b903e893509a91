"""The whole plan of one step in one numba kernel: no Python, and one sort, between the phases.

1. The candidates: the longest prefix whose tokens fit in the step; their costs.
2. One sort of them by length, longest first (a counting sort: lengths are bounded integers, and cost
   grows with length, so this is also by cost).
3. Large samples (each over ``LARGE`` of a mean rank's cost) longest first onto the least costly rank
   with room (LPT, a tournament tree over ranks).
4. The small ones dealt to ranks up to a water level (``_water.py``, ``_deal.py``); the few that find
   no rank under it go LPT, capped at the level where token capacity forces it.
   Steps 2-4 take the candidates but the newest ``RESERVE`` of the step's tokens.
5. The newest candidates, oldest first, into the room left (``_topup.py``).
6. Starvation repair where an older candidate is still deferred (``_repair.py``, rare), then moves
   from the costliest ranks (``_refine.py``).

numba's on-disk cache (``cache=True``) recompiles ``plan_kernel`` when this file changes, not when a module
it calls does: after editing one, delete ``pipeline/scheduler/__pycache__/*.nbi`` and ``*.nbc``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pipeline.scheduler._deal import deal
from pipeline.scheduler._place import place_longest_first
from pipeline.scheduler._refine import move_from_costliest
from pipeline.scheduler._repair import prefer_older
from pipeline.scheduler._topup import top_up
from pipeline.scheduler._water import water_level

# The newest candidates holding this share of the step's tokens are kept for the top-up (``_topup.py``).
RESERVE = 0.005
# A sample costing more than this share of a mean rank is placed one at a time by LPT.
LARGE = 0.1
# Refinement runs while the costliest rank is more than this share of the tolerance above the lower bound.
REFINE_SHARE = 1.0


@njit(cache=True)
def longest_first(lengths: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """The samples ``0..limit-1`` by decreasing length, ties by increasing index: where each goes, and the
    lengths in that order. A stable counting sort, reading and writing memory in order."""
    longest = 0
    for i in range(limit):
        longest = max(longest, lengths[i])
    position = np.empty(limit, np.int32)  # int32 as the plan: n < 2**31
    if longest > 4 * limit + 65536:  # a few very long samples: a comparison sort is cheaper
        order = np.argsort(-lengths[:limit], kind="mergesort")
        for k in range(limit):
            position[order[k]] = k
        return position, lengths[order]
    start = np.zeros(longest + 2, np.int64)
    for i in range(limit):
        start[longest - lengths[i] + 1] += 1
    sorted_length = np.empty(limit, np.int64)
    for slot in range(1, longest + 2):
        sorted_length[start[slot - 1] : start[slot - 1] + start[slot]] = longest - slot + 1
        start[slot] += start[slot - 1]
    for i in range(limit):
        slot = longest - lengths[i]
        position[i] = start[slot]
        start[slot] += 1
    return position, sorted_length


@njit(cache=True)
def plan_kernel(
    lengths: np.ndarray, n_ranks: int, n_micro: int, capacity: int, alpha: float, beta: float, tolerance: float
) -> tuple[np.ndarray, np.ndarray]:
    """Rank and micro-batch of every sample (int32, -1 when deferred). ``lengths`` are checked already."""
    n = lengths.shape[0]
    step_tokens = np.int64(n_ranks) * n_micro * capacity
    main_tokens = np.int64((1.0 - RESERVE) * step_tokens)
    limit = 0
    main = 0
    held = np.int64(0)
    while limit < n and held + lengths[limit] <= step_tokens:
        held += lengths[limit]
        limit += 1
        if held <= main_tokens:
            main = limit
    costs = np.empty(limit, np.float64)
    total_cost = 0.0
    largest_cost = 0.0
    for i in range(limit):
        x = np.float64(lengths[i])
        costs[i] = (alpha * x) * x + beta * x  # as CostModel.costs, element by element
        total_cost += costs[i]
        largest_cost = max(largest_cost, costs[i])

    # The placement phases work on the samples in sorted order, at positions 0..main-1: every array
    # they touch per sample is then read in order, not at random.
    position, sorted_length = longest_first(lengths, main)
    sorted_cost = np.empty(main, np.float64)
    for k in range(main):
        x = np.float64(sorted_length[k])
        sorted_cost[k] = (alpha * x) * x + beta * x  # the same expression: equal to costs[i]
    at_rank = np.full(main, -1, np.int32)
    at_micro = np.full(main, -1, np.int32)
    rank_cost = np.zeros(n_ranks, np.float64)
    tokens = np.zeros(n_ranks * n_micro, np.int64)
    micro_cost = np.zeros(n_ranks * n_micro, np.float64)
    threshold = max(LARGE, tolerance) * total_cost / n_ranks
    split = 0
    while split < main and sorted_cost[split] > threshold:
        split += 1
    place_longest_first(
        np.arange(split), sorted_length, sorted_cost, at_rank, at_micro, rank_cost, tokens, micro_cost, capacity,
        np.inf,
    )  # fmt: skip
    small_tokens = np.int64(0)
    small_cost = 0.0
    for k in range(split, main):
        small_tokens += sorted_length[k]
        small_cost += sorted_cost[k]
    free = np.empty(n_ranks, np.int64)
    for r in range(n_ranks):
        free[r] = n_micro * capacity - tokens[r * n_micro : (r + 1) * n_micro].sum()
    level, capped = water_level(rank_cost, free, small_cost, small_tokens, largest_cost, tolerance / 2)
    left = deal(
        split, main, sorted_length, sorted_cost, at_rank, at_micro, rank_cost, tokens, micro_cost,
        capacity, level, alpha, beta,
    )  # fmt: skip
    place_longest_first(
        left, sorted_length, sorted_cost, at_rank, at_micro, rank_cost, tokens, micro_cost, capacity,
        level if capped else np.inf,
    )  # fmt: skip

    rank = np.empty(n, np.int32)
    micro = np.empty(n, np.int32)
    rank[main:] = -1
    micro[main:] = -1
    deferred = False
    all_cost = total_cost  # what is placed if the top-up places everything
    for i in range(main):
        rank[i] = at_rank[position[i]]
        micro[i] = at_micro[position[i]]
        if rank[i] < 0:
            deferred = True
            all_cost -= costs[i]
    # The top-up may lift a rank up to a quarter of the tolerance above the lower bound it would leave if
    # it placed everything (and no costlier rank than the costliest so far).
    cost_cap = max(rank_cost.max(), (1.0 + tolerance / 4) * max(all_cost / n_ranks, largest_cost))
    top_up(main, limit, lengths, costs, rank, micro, rank_cost, tokens, micro_cost, capacity, cost_cap)
    if deferred:
        prefer_older(limit, lengths, costs, rank, micro, tokens, micro_cost, rank_cost, n_micro)
    # Moves only where the costliest rank is more than the tolerance above the lower bound of what is placed.
    mean_cost = rank_cost.sum() / n_ranks
    if rank_cost.max() > (1.0 + REFINE_SHARE * tolerance) * mean_cost:
        placed_largest = 0.0
        for i in range(limit):
            if rank[i] >= 0:
                placed_largest = max(placed_largest, costs[i])
        target = (1.0 + REFINE_SHARE * tolerance) * max(mean_cost, placed_largest)
        if rank_cost.max() > target:
            move_from_costliest(
                lengths, costs, limit, rank, micro, rank_cost, tokens, micro_cost, capacity, target,
                4 * n_ranks + 64,
            )  # fmt: skip
    return rank, micro
