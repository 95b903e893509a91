"""The top-up: deferred samples, oldest first, into whatever room a plan left.

Starvation-safe by construction: rooms only shrink and costs only grow during the top-up, so a sample
that found no place has no newer sample at least as long placed after it. (With two capacities a newer
sample with at least the length and patches may cost less, and find a place under the cap: the plan is
checked after the top-up, ``_step._make_safe``.)
"""

from __future__ import annotations

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.kernels.trees import least_with_room, rank_trees, update_rank
from pipeline.planning.scheduler._fit import top_up_two
from pipeline.planning.scheduler._micro import micro_with_room
from pipeline.planning.scheduler._placement import Candidates, Grid, Placement, move_tokens


@kernel
def top_up(items: np.ndarray, cands: Candidates, plan: Placement, grid: Grid, cost_cap: float) -> None:
    """Place the deferred samples at positions ``items``, in that order (oldest first), each on the least
    costly rank with a micro-batch with room (ties: the lowest rank, ``least_with_room``), there its least
    costly one with room, unless that lifts a non-empty rank above ``cost_cap`` (then it stays deferred).
    In place.

    The cap is fixed and the choice exact, and ranks only fill up, so where a sample found no place no
    later sample at least as long (so at least as costly) finds one.
    """
    if grid.patch_capacity > 0:
        top_up_two(items, cands, plan, grid, cost_cap)
        return
    if items.shape[0] == 0:
        return
    n_micro, tokens = grid.micro, plan.tokens
    room = np.empty(grid.ranks, np.int64)
    for r in range(grid.ranks):
        room[r] = grid.capacity - tokens[r * n_micro : (r + 1) * n_micro].min()
    trees = rank_trees(plan.rank_cost, room)
    for k in items:
        length = np.int64(cands.length[k])
        cost = cands.cost[k]
        if trees.max_room[1] < length:
            continue  # no micro-batch has room
        r = least_with_room(trees, length)
        if plan.rank_cost[r] + cost > max(cost_cap, cost):  # an empty rank takes any sample
            continue
        base = r * n_micro
        best = micro_with_room(tokens, plan.micro_cost, base, n_micro, grid.capacity - length)
        plan.at[k] = (r << grid.shift) | best
        move_tokens(plan, r, base + best, length, cost)
        update_rank(trees, r, plan.rank_cost[r], grid.capacity - tokens[base : base + n_micro].min())
