"""The top-up: deferred samples, oldest first, into whatever room a plan left.

Starvation-safe by construction with tokens only: rooms only shrink and costs only grow during the top-up, so
a sample that found no place has no newer sample at least as long placed after it. (With patches too a newer
sample with at least the length and patches may cost less, and find a place under the cap: the plan is made
safe after the top-up, ``_step.make_safe``.)
"""

from __future__ import annotations

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.kernels.trees import ROOM, least_with_room, room_trees, update_rank
from pipeline.planning.scheduler._placement import (
    Candidates,
    Grid,
    Placement,
    least_costly_fit,
    patches_of,
    place,
    rooms,
)


@kernel
def top_up(items: np.ndarray, cands: Candidates, plan: Placement, grid: Grid, cost_cap: float) -> None:
    """Place the deferred samples at positions ``items``, in that order (oldest first), each on the least
    costly rank with a micro-batch with room (ties: the lowest rank, ``least_with_room``), there its least
    costly one with room, unless that lifts a non-empty rank above ``cost_cap`` (then it stays deferred).
    In place.

    The cap is fixed and the choice exact, and ranks only fill up, so where a sample found no place no
    later sample at least as long (so, with tokens only, at least as costly) finds one.
    """
    if items.shape[0] == 0:
        return
    slots = rooms(plan, grid)
    trees = room_trees(plan.rank_cost, slots)
    for k in items:
        length, patches, cost = np.int64(cands.length[k]), patches_of(cands, grid, k), cands.cost[k]
        if trees.node[1, ROOM] < length:
            continue  # no micro-batch has room
        r = least_with_room(trees, slots, length, patches)
        if r < 0 or plan.rank_cost[r] + cost > max(cost_cap, cost):  # an empty rank takes any sample
            continue
        place(cands, plan, grid, k, r, least_costly_fit(plan, grid, r, length, patches))
        update_rank(trees, slots, r, plan.rank_cost[r])
