"""The prefix plan, a starvation-safe candidate of one capacity (text steps).

LPT over the longest prefix of the candidates, in age order, that LPT places whole; then, oldest first,
each later candidate shorter than every candidate deferred so far goes to the least costly rank with a
micro-batch with room (``_topup.top_up``'s choice, uncapped). Starvation-safe by construction: every sample of the
prefix is placed, and a later one is placed only when it is shorter than every older deferred one.

Where the pool holds a little more than the step, LPT over all of it defers a few long samples and
leaves ranks uneven around them; LPT over the prefix meets no sample it cannot place, and the shorter
samples after it fill the rooms left. The prefix is found by halving (``PREFIX_TRIES`` LPT runs at most,
from the longest prefix down), so it is one that LPT places whole, the longest one of those tried.
"""

from __future__ import annotations

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.kernels.trees import ROOM, least_with_room, room_trees, update_rank
from pipeline.planning.scheduler._lpt import lpt_place
from pipeline.planning.scheduler._placement import Candidates, Grid, Placement, least_costly_fit, on_base, place, rooms

# LPT runs spent on finding the prefix, at most.
PREFIX_TRIES = 24


@kernel
def _lpt_of_prefix(
    cands: Candidates, grid: Grid, like: np.ndarray, prefix: int, base: Placement
) -> tuple[Placement, bool]:
    """LPT over the candidates of the ``prefix`` oldest samples (the others deferred), and whether it
    placed all of them."""
    inside = np.flatnonzero(cands.order < prefix)
    sub = Candidates(cands.order[inside], cands.length[inside], cands.cost[inside], cands.patches, cands.encoder)
    sub_plan = on_base(np.full_like(like[: inside.shape[0]], -1), base)
    lpt_place(sub, sub_plan, grid)
    plan = on_base(np.full_like(like, -1), base)
    whole = True
    for j in range(inside.shape[0]):
        plan.at[inside[j]] = sub_plan.at[j]
        whole = whole and sub_plan.at[j] >= 0
    return Placement(plan.at, sub_plan.rank_cost, sub_plan.tokens, sub_plan.micro_cost, sub_plan.patches), whole


@kernel
def _place_later(cands: Candidates, plan: Placement, grid: Grid, prefix: int) -> None:
    """The candidates after the prefix, oldest first, each shorter than every one deferred so far on the
    least costly rank with a micro-batch with room (ties: the lowest), there its least costly one with
    room. In place."""
    later = np.flatnonzero(cands.order >= prefix)
    later = later[np.argsort(cands.order[later], kind="mergesort")]
    slots = rooms(plan, grid)
    trees = room_trees(plan.rank_cost, slots)
    shortest = np.iinfo(np.int64).max
    for k in later:
        length = np.int64(cands.length[k])
        if length >= shortest or trees.node[1, ROOM] < length:
            shortest = min(shortest, length)
            continue
        r = least_with_room(trees, slots, length, np.int64(0))
        place(cands, plan, grid, k, r, least_costly_fit(plan, grid, r, length, np.int64(0)))
        update_rank(trees, slots, r, plan.rank_cost[r])


@kernel
def prefix_plan(cands: Candidates, grid: Grid, like: np.ndarray, base: Placement) -> Placement:
    """The prefix plan (the module's docstring) of the candidates (one capacity), which LPT does not place
    whole; ``at`` of ``like``'s type."""
    low, high = 0, cands.order.shape[0] - 1  # a prefix of ``low`` is placed whole (or empty), of ``high + 1`` not
    best = on_base(np.full_like(like, -1), base)
    tries = 0
    step = 1
    while low < high and tries < PREFIX_TRIES:  # from the top down, doubling, then halving
        probe = max(high - step + 1, low + 1) if step > 0 else (low + high + 1) // 2
        plan, whole = _lpt_of_prefix(cands, grid, like, probe, base)
        tries += 1
        if whole:
            low, best = probe, plan
            step = 0
        else:
            high = probe - 1
            step = step * 2 if step > 0 else 0
    _place_later(cands, best, grid, low)
    return best
