"""Where a sample fits when a micro-batch has two capacities, tokens and vision patches; LPT and the top-up
with both.

A rank has room for a sample when one of its micro-batches has room for its tokens and its patches at
once, so a rank's free tokens and free patches (each the most of any of its micro-batches) only say where
it cannot go. ``RoomTrees`` keep both over the ranks, with each rank's key (its cost); ``least_fitting``
searches them and checks a rank that may fit micro-batch by micro-batch. Ties go to the lowest rank, as in
``pipeline.planning.kernels.trees``, so with patches all 0 the answers are the one-capacity searches'.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.scheduler._placement import Candidates, Grid, Placement, fits_slot, move_tokens


class RoomTrees(NamedTuple):
    """Binary trees over ranks (root 1, rank ``r`` at leaf ``leaves + r``): the least key, the most free
    tokens and the most free patches of a micro-batch under each node. Padding leaves: key +inf, rooms -1."""

    min_key: np.ndarray  # float64
    max_room: np.ndarray  # int64
    max_patch_room: np.ndarray  # int64
    leaves: int


@kernel(inline="always")
def first_fit(plan: Placement, grid: Grid, base: np.int64, length: np.int64, patches: np.int64) -> int:
    """The first micro-batch of the rank at ``base`` with room for both, or -1."""
    for m in range(grid.micro):
        if fits_slot(plan, grid, base + m, length, patches):
            return m
    return -1


@kernel(inline="always")
def least_costly_fit(plan: Placement, grid: Grid, base: np.int64, length: np.int64, patches: np.int64) -> int:
    """``_micro.micro_with_room`` with both capacities: the least costly micro-batch of the rank at ``base``
    with room for both (ties: the fewer tokens, then the first), or -1."""
    best = -1
    for m in range(grid.micro):
        slot = base + m
        if fits_slot(plan, grid, slot, length, patches) and (
            best < 0
            or plan.micro_cost[slot] < plan.micro_cost[base + best]
            or (plan.micro_cost[slot] == plan.micro_cost[base + best] and plan.tokens[slot] < plan.tokens[base + best])
        ):
            best = m
    return best


@kernel
def room_trees(plan: Placement, grid: Grid) -> RoomTrees:
    """The trees over the plan's ranks, each keyed by its cost."""
    leaves = 1
    while leaves < grid.ranks:
        leaves *= 2
    trees = RoomTrees(
        np.full(2 * leaves, np.inf), np.full(2 * leaves, -1, np.int64), np.full(2 * leaves, -1, np.int64), leaves
    )
    for r in range(grid.ranks):
        _set_leaf(trees, plan, grid, r, plan.rank_cost[r])
    for node in range(leaves - 1, 0, -1):
        _pull(trees, node)
    return trees


@kernel(inline="always")
def _set_leaf(trees: RoomTrees, plan: Placement, grid: Grid, r: int, key: float) -> None:
    base = r * grid.micro
    leaf = trees.leaves + r
    trees.min_key[leaf] = key
    trees.max_room[leaf] = grid.capacity - plan.tokens[base : base + grid.micro].min()
    trees.max_patch_room[leaf] = grid.patch_capacity - plan.patches[base : base + grid.micro].min()


@kernel(inline="always")
def _pull(trees: RoomTrees, node: int) -> None:
    trees.min_key[node] = min(trees.min_key[2 * node], trees.min_key[2 * node + 1])
    trees.max_room[node] = max(trees.max_room[2 * node], trees.max_room[2 * node + 1])
    trees.max_patch_room[node] = max(trees.max_patch_room[2 * node], trees.max_patch_room[2 * node + 1])


@kernel
def set_rank(trees: RoomTrees, plan: Placement, grid: Grid, r: int, key: float) -> None:
    """Rank ``r``'s key, and its rooms from the plan, and the nodes above it."""
    _set_leaf(trees, plan, grid, r, key)
    node = (trees.leaves + r) >> 1
    while node >= 1:
        _pull(trees, node)
        node >>= 1


@kernel
def least_fitting(trees: RoomTrees, plan: Placement, grid: Grid, length: np.int64, patches: np.int64) -> int:
    """The rank of least key with a micro-batch that has room for ``length`` tokens and ``patches`` patches
    (ties: the lowest rank), or -1: ``trees.least_with_room``'s search, also pruned by free patches, which
    checks each rank it reaches micro-batch by micro-batch."""
    min_key, leaves = trees.min_key, trees.leaves
    best, best_key = -1, np.inf
    stack = np.empty(128, np.int64)
    stack[0] = 1
    depth = 1
    while depth > 0:
        depth -= 1
        node = stack[depth]
        if trees.max_room[node] < length or trees.max_patch_room[node] < patches or min_key[node] > best_key:
            continue
        if min_key[node] == best_key and _lowest_rank(node, leaves) > best:
            continue
        if node >= leaves:
            if first_fit(plan, grid, (node - leaves) * grid.micro, length, patches) >= 0:
                best, best_key = node - leaves, min_key[node]
            continue
        left, right = 2 * node, 2 * node + 1
        if min_key[right] < min_key[left]:
            left, right = right, left
        stack[depth] = right  # popped after the whole of the other child
        stack[depth + 1] = left
        depth += 2
    return best


@kernel(inline="always")
def _lowest_rank(node: int, leaves: int) -> int:
    while node < leaves:
        node *= 2
    return node - leaves


@kernel(inline="always")
def _place(cands: Candidates, plan: Placement, grid: Grid, k: np.int64, r: np.int64, m: np.int64) -> None:
    slot = r * grid.micro + m
    move_tokens(plan, r, slot, np.int64(cands.length[k]), cands.cost[k])
    plan.patches[slot] += cands.patches[k]
    plan.at[k] = (r << grid.shift) | m


@kernel
def lpt_place_two(cands: Candidates, plan: Placement, grid: Grid) -> None:
    """``_lpt.lpt_place`` with both capacities, the candidates costliest first: each to the least costly
    rank with a micro-batch with room for both (ties: the lowest), into its first such micro-batch; a
    sample no micro-batch has room for is deferred. In place."""
    trees = room_trees(plan, grid)
    for k in range(cands.length.shape[0]):
        length, patches = np.int64(cands.length[k]), cands.patches[k]
        r = least_fitting(trees, plan, grid, length, patches)
        if r < 0:
            plan.at[k] = -1
            continue
        _place(cands, plan, grid, k, r, first_fit(plan, grid, r * grid.micro, length, patches))
        set_rank(trees, plan, grid, r, plan.rank_cost[r])


@kernel
def top_up_two(items: np.ndarray, cands: Candidates, plan: Placement, grid: Grid, cost_cap: float) -> None:
    """``_topup.top_up`` with both capacities: the deferred samples at positions ``items``, in that order,
    each on the least costly rank with a micro-batch with room for both, there its least costly such
    micro-batch, unless that lifts a non-empty rank above ``cost_cap``. In place."""
    if items.shape[0] == 0:
        return
    trees = room_trees(plan, grid)
    for k in items:
        length, patches, cost = np.int64(cands.length[k]), cands.patches[k], cands.cost[k]
        r = least_fitting(trees, plan, grid, length, patches)
        if r < 0 or plan.rank_cost[r] + cost > max(cost_cap, cost):  # an empty rank takes any sample
            continue
        _place(cands, plan, grid, k, r, least_costly_fit(plan, grid, r * grid.micro, length, patches))
        set_rank(trees, plan, grid, r, plan.rank_cost[r])
