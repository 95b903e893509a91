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


@njit(cache=True, inline="always")
def _cost(alpha: float, beta: float, length: np.int64) -> float:
    x = np.float64(length)
    return (alpha * x) * x + beta * x  # as CostModel.costs: every cost of the kernel is this expression


@njit(cache=True)
def _fill_costs(costs: np.ndarray, lengths: np.ndarray, start: int, end: int, alpha: float, beta: float) -> None:
    for i in range(start, end):
        costs[i] = _cost(alpha, beta, lengths[i])


@njit(cache=True)
def _counting_sort(lengths: np.ndarray, limit: int, longest: int) -> tuple[np.ndarray, np.ndarray]:
    sorted_length = np.empty(limit, np.int32)
    start = np.zeros(longest + 2, np.int64)
    for i in range(limit):
        start[longest - lengths[i] + 1] += 1
    for slot in range(1, longest + 2):
        first = start[slot - 1]
        end = first + start[slot]
        length = longest - slot + 1
        for k in range(first, end):  # a plain loop: a slice assignment costs more per (often empty) bucket
            sorted_length[k] = length
        start[slot] = end
    return sorted_length, start


@njit(cache=True)
def _comparison_sort(lengths: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(-lengths[:limit], kind="mergesort")
    position = np.empty(limit, np.int32)  # int32 as the plan: n < 2**31
    sorted_length = np.empty(limit, np.int32)
    for k in range(limit):
        position[order[k]] = k
        sorted_length[k] = lengths[order[k]]
    return sorted_length, position


@njit(cache=True)
def longest_first(
    lengths: np.ndarray, limit: int, longest: int, alpha: float, beta: float, threshold: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, np.int64, float]:
    """The samples ``0..limit-1`` (none longer than ``longest``) by decreasing length, ties by increasing
    index, with a stable counting sort: their lengths in that order (int32: lengths fit a micro-batch), and
    where the samples of each length start, ``start[longest - length]`` (sample ``i`` goes to
    ``start[longest - lengths[i]]`` plus the number of earlier samples as long). Where a few very long
    samples make a comparison sort cheaper, ``start`` is empty and ``position`` says where each goes.
    Also the number ``split`` of samples costing more than ``threshold`` (the first ``split`` in that
    order), and the tokens and cost of the others, the cost added up in that order. (Each sort is a
    function of its own: with both in one, the counting sort compiles to slower code.)"""
    if longest > 4 * limit + 65536:
        sorted_length, position = _comparison_sort(lengths, limit)
        start = np.empty(0, np.int64)
    else:
        sorted_length, start = _counting_sort(lengths, limit, longest)
        position = np.empty(0, np.int32)
    split = 0
    while split < limit and _cost(alpha, beta, sorted_length[split]) > threshold:
        split += 1
    small_tokens = np.int64(0)
    small_cost = 0.0
    for k in range(split, limit):
        small_tokens += sorted_length[k]
        small_cost += _cost(alpha, beta, sorted_length[k])
    return sorted_length, start, position, split, small_tokens, small_cost


@njit(cache=True)
def _unsort_counted(
    lengths: np.ndarray,
    main: int,
    longest: int,
    start: np.ndarray,
    at: np.ndarray,
    shift: int,
    rank: np.ndarray,
    micro: np.ndarray,
    total_cost: float,
    alpha: float,
    beta: float,
) -> tuple[bool, float]:
    """Rank and micro-batch of samples ``0..main-1`` from ``at`` (in counting-sort order), the counting sort's
    last pass done here rather than into a position array of its own. Whether one is not placed, and
    ``total_cost`` less their costs (in index order)."""
    low_bits = (1 << shift) - 1
    deferred = False
    all_cost = total_cost
    for i in range(main):
        k = start[longest - lengths[i]]
        start[longest - lengths[i]] = k + 1
        slot = at[k]
        if slot < 0:
            rank[i] = -1
            micro[i] = -1
            deferred = True
            all_cost -= _cost(alpha, beta, lengths[i])
        else:
            rank[i] = slot >> shift
            micro[i] = slot & low_bits
    return deferred, all_cost


@njit(cache=True)
def _unsort(
    lengths: np.ndarray,
    main: int,
    position: np.ndarray,
    at: np.ndarray,
    shift: int,
    rank: np.ndarray,
    micro: np.ndarray,
    total_cost: float,
    alpha: float,
    beta: float,
) -> tuple[bool, float]:
    """``_unsort_counted`` where the samples were sorted by comparison: sample ``i`` at ``position[i]``."""
    low_bits = (1 << shift) - 1
    deferred = False
    all_cost = total_cost
    for i in range(main):
        slot = at[position[i]]
        if slot < 0:
            rank[i] = -1
            micro[i] = -1
            deferred = True
            all_cost -= _cost(alpha, beta, lengths[i])
        else:
            rank[i] = slot >> shift
            micro[i] = slot & low_bits
    return deferred, all_cost


@njit(cache=True)
def plan_kernel(
    lengths: np.ndarray,
    n_ranks: int,
    n_micro: int,
    capacity: int,
    alpha: float,
    beta: float,
    tolerance: float,
    at: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Rank and micro-batch of every sample (int32, -1 when deferred). ``lengths`` are checked already;
    ``at`` is scratch of ``lengths``' size, int32 where ``(n_ranks - 1) << bits(n_micro - 1)`` fits, else int64."""
    n = lengths.shape[0]
    step_tokens = np.int64(n_ranks) * n_micro * capacity
    main_tokens = np.int64((1.0 - RESERVE) * step_tokens)
    limit = 0
    main = 0
    held = np.int64(0)
    total_cost = 0.0
    largest_cost = 0.0
    longest = 0  # among the first ``main``
    while limit < n and held + lengths[limit] <= step_tokens:
        length = lengths[limit]
        held += length
        limit += 1
        if held <= main_tokens:
            main = limit
            longest = max(longest, length)
        cost = _cost(alpha, beta, length)
        total_cost += cost  # in index order, as the costs of CostModel.costs would add up
        largest_cost = max(largest_cost, cost)
    # Costs by sample, filled only where a phase reads them: the top-up's samples now, all of them for the
    # rare repair and refinement.
    costs = np.empty(limit, np.float64)
    _fill_costs(costs, lengths, main, limit, alpha, beta)
    shift = 0
    while (1 << shift) < n_micro:
        shift += 1

    # The placement phases work on the samples in sorted order, at positions 0..main-1: every array
    # they touch per sample is then read in order, not at random. ``at`` holds rank << shift | micro-batch
    # of each, -1 while not placed: one array to gather from at the end, not two.
    threshold = max(LARGE, tolerance) * total_cost / n_ranks
    sorted_length, start, position, split, small_tokens, small_cost = longest_first(
        lengths, main, longest, alpha, beta, threshold
    )
    at = at[:main]  # every phase below writes each of its samples' entries, -1 where it does not place it
    rank_cost = np.zeros(n_ranks, np.float64)
    tokens = np.zeros(n_ranks * n_micro, np.int64)
    micro_cost = np.zeros(n_ranks * n_micro, np.float64)
    if split > 0:
        place_longest_first(
            np.arange(split),
            sorted_length,
            alpha,
            beta,
            at,
            shift,
            rank_cost,
            tokens,
            micro_cost,
            capacity,
            np.inf,
        )
    free = np.empty(n_ranks, np.int64)
    for r in range(n_ranks):
        free[r] = n_micro * capacity - tokens[r * n_micro : (r + 1) * n_micro].sum()
    level, capped = water_level(rank_cost, free, small_cost, small_tokens, largest_cost, tolerance / 2)
    left = deal(
        split,
        main,
        sorted_length,
        at,
        shift,
        rank_cost,
        tokens,
        micro_cost,
        capacity,
        level,
        alpha,
        beta,
    )
    if left.shape[0] > 0:
        place_longest_first(
            left,
            sorted_length,
            alpha,
            beta,
            at,
            shift,
            rank_cost,
            tokens,
            micro_cost,
            capacity,
            level if capped else np.inf,
        )

    rank = np.empty(n, np.int32)
    micro = np.empty(n, np.int32)
    rank[main:] = -1
    micro[main:] = -1
    # ``all_cost``: what is placed if the top-up places everything.
    if start.shape[0] > 0:
        deferred, all_cost = _unsort_counted(
            lengths, main, longest, start, at, shift, rank, micro, total_cost, alpha, beta
        )
    else:
        deferred, all_cost = _unsort(lengths, main, position, at, shift, rank, micro, total_cost, alpha, beta)
    # The top-up may lift a rank up to a quarter of the tolerance above the lower bound it would leave if
    # it placed everything (and no costlier rank than the costliest so far).
    cost_cap = max(rank_cost.max(), (1.0 + tolerance / 4) * max(all_cost / n_ranks, largest_cost))
    top_up(main, limit, lengths, costs, rank, micro, rank_cost, tokens, micro_cost, capacity, cost_cap)
    filled = False
    if deferred:
        _fill_costs(costs, lengths, 0, main, alpha, beta)
        filled = True
        prefer_older(limit, lengths, costs, rank, micro, tokens, micro_cost, rank_cost, n_micro)
    # Moves only where the costliest rank is more than the tolerance above the lower bound of what is placed.
    mean_cost = rank_cost.sum() / n_ranks
    if rank_cost.max() > (1.0 + REFINE_SHARE * tolerance) * mean_cost:
        if not filled:
            _fill_costs(costs, lengths, 0, main, alpha, beta)
        placed_largest = 0.0
        for i in range(limit):
            if rank[i] >= 0:
                placed_largest = max(placed_largest, costs[i])
        target = (1.0 + REFINE_SHARE * tolerance) * max(mean_cost, placed_largest)
        if rank_cost.max() > target:
            move_from_costliest(
                lengths,
                costs,
                limit,
                rank,
                micro,
                rank_cost,
                tokens,
                micro_cost,
                capacity,
                target,
                4 * n_ranks + 64,
            )
    return rank, micro
