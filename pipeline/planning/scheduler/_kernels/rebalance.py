"""The pass that evens out the ranks of a plan by moves: placed samples move from the costliest ranks to the
cheapest ranks (refinement restricted to the costliest ranks).

Only moves: the set of placed samples, hence the lower bound and the guarantee against starvation,
stays as it is, and every move lowers the larger of the two ranks it touches. With two capacities a sample
moves only into a micro-batch with room for its tokens and its patches. Where full micro-batches leave no
room to move, samples trade places instead (``trades``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.kernels.trees import MinTree, first_fit, new_min_tree, rekey_pair, restore_keys, set_key
from pipeline.planning.scheduler._kernels.state import (
    Candidates,
    Grid,
    Placement,
    flat_slot,
    least_costly_fit,
    move_patches,
    move_tokens,
    patches_of,
    place,
    rooms,
)

# Cheapest ranks tried for one costly rank before giving up on it.
_MOVE_TRIES = 8


class ByCost(NamedTuple):
    """The ranks cheapest first and costliest first (keyed by minus the cost), and room for the ranks
    taken out of ``cheapest`` while one costly rank tries them."""

    cheapest: MinTree
    costliest: MinTree
    skipped: np.ndarray


class Givers(NamedTuple):
    """The positions of the samples that may move, contiguous by rank: rank ``r``'s are
    ``member[begin[r] : begin[r] + count[r]]``."""

    begin: np.ndarray
    count: np.ndarray
    member: np.ndarray


@kernel
def move_from_costliest(cands: Candidates, plan: Placement, grid: Grid, target: float, max_moves: int) -> int:
    """While the costliest rank is above ``target``, move one of its samples to one of the cheapest ranks
    with room: the sample whose cost is nearest half their difference, below it. Only the samples of ranks
    above ``target`` at the start move, each at most once. In place; returns the moves."""
    givers = _givers(plan, grid, target)
    by_cost = ByCost(new_min_tree(grid.ranks), new_min_tree(grid.ranks), np.empty(_MOVE_TRIES, np.int64))
    for r in range(grid.ranks):
        set_key(by_cost.cheapest, r, plan.rank_cost[r])
        set_key(by_cost.costliest, r, -plan.rank_cost[r])
    moves = 0
    while moves < max_moves:
        a = by_cost.costliest.ids[0]
        if plan.rank_cost[a] <= target or not _give_away(cands, plan, grid, givers, a, by_cost):
            break
        moves += 1
    return moves


@kernel
def _givers(plan: Placement, grid: Grid, target: float) -> Givers:
    """The samples of the ranks above ``target`` (only those give samples away); empty for the others."""
    at, shift = plan.at, grid.shift
    begin = np.zeros(grid.ranks + 1, np.int64)
    for k in range(at.shape[0]):
        if at[k] >= 0 and plan.rank_cost[at[k] >> shift] > target:
            begin[(at[k] >> shift) + 1] += 1
    for r in range(grid.ranks):
        begin[r + 1] += begin[r]
    count = np.zeros(grid.ranks, np.int64)
    member = np.empty(begin[grid.ranks], np.int32)
    for k in range(at.shape[0]):
        if at[k] >= 0 and plan.rank_cost[at[k] >> shift] > target:
            r = at[k] >> shift
            member[begin[r] + count[r]] = k
            count[r] += 1
    return Givers(begin, count, member)


@kernel
def _give_away(cands: Candidates, plan: Placement, grid: Grid, givers: Givers, a: int, by_cost: ByCost) -> bool:
    """Move one sample of rank ``a`` to the first of its ``_MOVE_TRIES`` cheapest ranks that one suits; whether
    one moved. The ranks tried in vain are out of ``cheapest`` while the others are tried."""
    cheapest, skipped = by_cost.cheapest, by_cost.skipped
    n_skipped = 0
    moved = False
    while n_skipped < _MOVE_TRIES:
        b = cheapest.ids[0]
        gap = plan.rank_cost[a] - plan.rank_cost[b]
        if cheapest.keys[0] == np.inf or gap <= 0.0:
            break
        best = _nearest_half(cands, plan, grid, givers, a, b, gap)
        if best < 0:
            set_key(cheapest, b, np.inf)  # no use to this rank; try the next
            skipped[n_skipped] = b
            n_skipped += 1
            continue
        _move(cands, plan, grid, givers, a, b, best)
        rekey_pair(cheapest, by_cost.costliest, (a, b), plan.rank_cost)
        moved = True
        break
    restore_keys(cheapest, skipped, n_skipped, plan.rank_cost)
    return moved


@kernel
def _nearest_half(cands: Candidates, plan: Placement, grid: Grid, givers: Givers, a: int, b: int, gap: float) -> int:
    """The slot in ``givers`` of rank ``a``'s sample that fits a micro-batch of rank ``b`` whose cost is
    nearest half of ``gap``, below ``gap``; -1 where none scores above 0."""
    base_b = b * grid.micro
    room = grid.capacity - plan.tokens[base_b : base_b + grid.micro].min()
    slots = rooms(plan, grid)
    best, best_score = -1, -1.0
    for slot in range(givers.begin[a], givers.begin[a] + givers.count[a]):
        k = givers.member[slot]
        cost = cands.cost[k]
        if cands.length[k] <= room and cost < gap:
            score = min(cost, gap - cost)
            if score > best_score and (
                grid.patch_capacity == 0 or first_fit(slots, b, cands.length[k], cands.patches[k]) >= 0
            ):
                best, best_score = slot, score
    return best if best_score > 0.0 else -1


@kernel
def _move(cands: Candidates, plan: Placement, grid: Grid, givers: Givers, a: int, b: int, slot: int) -> None:
    """Move the sample at ``slot`` of ``givers`` from rank ``a`` to rank ``b``'s least costly micro-batch with
    room. A moved sample is not moved again: it leaves its list and joins none."""
    last = givers.begin[a] + givers.count[a] - 1
    k = givers.member[slot]
    givers.member[slot] = givers.member[last]
    givers.count[a] -= 1
    move_tokens(plan, a, flat_slot(grid, plan.at[k]), -np.int64(cands.length[k]), -cands.cost[k])
    move_patches(plan, grid, flat_slot(grid, plan.at[k]), cands, k, -1)
    place(
        cands, plan, grid, k, b, least_costly_fit(plan, grid, b, np.int64(cands.length[k]), patches_of(cands, grid, k))
    )
