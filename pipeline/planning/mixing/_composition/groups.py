"""The numba kernel that builds one group of long samples per rank up to a level of excess cost.

Seeds go first, the largest first, each onto the rank with the least excess that has room in a
micro-batch (else onto the least loaded rank). Then the rank with the least excess, while more than
``slack`` below the level, takes the candidate with the largest excess that keeps it at most ``slack``
above the level and fits one of its micro-batches; a rank that finds none is closed. A sample goes into
the fullest micro-batch with room for it, which keeps whole micro-batches free for the next long ones.
Every tie is broken by index, so the result is the same on any machine. The rank with the least excess
is found in trees over the ranks (with room for a seed: ``least_with_room`` of
``pipeline.planning.kernels.trees``; among the open ranks: a tournament tree), not by a scan of every
rank, which at 10,240 ranks made a call cost O(R^2).

**Packing the holes.** Short samples fill the ranks around the groups. Where a source's short samples
cannot fill its allowance (a window of mostly long samples: uniform lengths up to the context, or long
documents that hold most of the tokens), the holes the groups leave stay empty unless something fits
them, so the kernel can pack them itself (``packing.fill_holes``): long and short candidates, the longest that
fits the emptiest micro-batch of the rank of least excess, but no longer than keeps that rank near a
target excess (the mean over ranks of a first, greedy packing), so the ranks end full *and* alike.
"""

from __future__ import annotations

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.kernels.trees import least_with_room, new_min_tree, room_trees, set_key, update_rank
from pipeline.planning.mixing._composition.kernel_arrays import (
    Grid,
    Grouping,
    Holes,
    Packing,
    Samples,
    as_grid,
    as_holes,
    as_samples,
    copy_of,
    fullest_with_room,
    take_candidate,
    token_rooms,
)
from pipeline.planning.mixing._composition.packing import fill_holes, next_free
from pipeline.planning.mixing._composition.values import Groups, HoleFill, Longs, Slots
from pipeline.planning.shape import StepShape


def build_groups(
    seeds: Longs,
    candidates: Longs,
    order: np.ndarray,
    allowance: np.ndarray,
    level: float,
    slack: float,
    shape: StepShape,
    anchor: int = -1,
    holes: HoleFill | None = None,
) -> Groups:
    """Groups of long samples per rank up to ``level`` of excess (the module's docstring). ``order``
    lists the candidates by decreasing excess, older first among equals (only those it lists are
    grouped); a candidate counts against its source's ``allowance`` (tokens), which only the last one
    picked from a source may overshoot. The candidate ``anchor`` (if >= 0) is placed first among the
    seeds. With ``holes``, where a source's short samples cannot fill its allowance, the candidates then
    pack the micro-batches' holes (``packing.fill_holes``)."""
    holes = holes or HoleFill.none(len(allowance))
    held = np.zeros(len(candidates.length), dtype=bool)
    if anchor >= 0:
        held[anchor] = True
        seeds = seeds.with_one(candidates, anchor)
        allowance = allowance.copy()
        allowance[candidates.source[anchor]] -= candidates.length[anchor]
    packing = build_groups_kernel(
        as_samples(seeds),
        as_samples(candidates),
        Grouping(order.astype(np.int64), held, float(level), float(slack)),
        allowance.astype(np.float64),
        as_grid(shape),
        as_holes(holes),
    )
    seed_slot, cand_slot = packing.seed_slot, packing.cand_slot
    if anchor >= 0:
        cand_slot[anchor], seed_slot = seed_slot[-1], seed_slot[:-1]
    return Groups(packing.chosen, packing.excess, packing.bins, Slots(seed_slot, cand_slot, packing.first_slot))


@kernel
def build_groups_kernel(
    seeds: Samples, cands: Samples, grouping: Grouping, allowance: np.ndarray, grid: Grid, holes: Holes
) -> Packing:
    """The groups (``build_groups``), and where a source's short filler cannot cover its allowance left,
    the holes packed (``_pack``)."""
    ranks, micro_batches = grid.ranks, grid.micro_batches
    packing = Packing(
        np.zeros(ranks),
        np.zeros((ranks, micro_batches), dtype=np.int64),
        grouping.held.copy(),
        allowance.astype(np.float64),
        np.full(len(seeds.length), -1, np.int64),
        np.full(len(cands.length), -1, np.int64),
        np.full(len(holes.first), -1, np.int64),
    )
    _place_seeds(seeds, packing, grid.capacity)
    _group(cands, grouping, packing, grid.capacity)
    short_of_filler = False
    for s in range(len(packing.left)):
        short_of_filler |= packing.left[s] > holes.filler[s]
    if short_of_filler:
        _pack(packing, cands, holes, grid.capacity)
    return packing


@kernel
def _place_seeds(seeds: Samples, packing: Packing, capacity: int) -> None:
    """The seeds, the largest excess first, each onto the rank of least excess with room in a micro-batch
    (its fullest with room), else onto the least loaded rank (in no micro-batch)."""
    excess, bins = packing.excess, packing.bins
    slots = token_rooms(bins, capacity)
    trees = room_trees(excess, slots)
    for i in np.argsort(-seeds.excess, kind="mergesort"):
        length = seeds.length[i]
        target = least_with_room(trees, slots, np.int64(length), np.int64(0))
        if target < 0:
            target = int(np.argmin(excess))
        else:
            m = fullest_with_room(bins, target, length, capacity)
            bins[target, m] += length
            packing.seed_slot[i] = target * bins.shape[1] + m
        excess[target] += seeds.excess[i]
        update_rank(trees, slots, target, excess[target])


@kernel
def _group(cands: Samples, grouping: Grouping, packing: Packing, capacity: int) -> None:
    """While a rank is open, the one of least excess (ties: the lowest) takes the candidate of largest
    excess that keeps it within ``slack`` above the level and fits one of its micro-batches, or closes."""
    order, excess = grouping.order, packing.excess
    n = len(order)
    ranked = np.empty(n)  # minus the excess of each candidate in ``order``: increasing
    skip = np.arange(n + 1)  # ``next_free`` over ``order``
    for j in range(n):
        ranked[j] = -cands.excess[order[j]]
        if grouping.held[order[j]]:
            skip[j] = j + 1
    open_ranks = new_min_tree(len(excess))  # a closed rank's key is +inf
    for r in range(len(excess)):
        set_key(open_ranks, r, excess[r])
    while open_ranks.keys[0] < np.inf:
        r = open_ranks.ids[0]
        pick, m = -1, -1
        if grouping.level - excess[r] > grouping.slack:
            start = int(np.searchsorted(ranked, excess[r] - grouping.level - grouping.slack))
            pick, m = _first_that_fits(cands, order, skip, packing, r, start, capacity)
        if pick < 0:
            set_key(open_ranks, r, np.inf)
            continue
        skip[pick] = pick + 1
        take_candidate(packing, cands, order[pick], r, m)
        set_key(open_ranks, r, excess[r])


@kernel
def _first_that_fits(
    cands: Samples, order: np.ndarray, skip: np.ndarray, packing: Packing, r: int, start: int, capacity: int
) -> tuple[int, int]:
    """The first free position ``>= start`` in ``order`` whose candidate has allowance left and fits a
    micro-batch of rank ``r``, and that micro-batch; (-1, -1) for none."""
    j = next_free(skip, start)
    while j < len(order):
        c = order[j]
        if packing.left[cands.source[c]] > 0:
            m = fullest_with_room(packing.bins, r, cands.length[c], capacity)
            if m >= 0:
                return j, m
        else:  # an allowance only shrinks: no rank takes this candidate any more
            skip[j] = j + 1
        j = next_free(skip, j + 1)
    return -1, -1


@kernel
def _pack(packing: Packing, cands: Samples, holes: Holes, capacity: int) -> None:
    """``fill_holes`` towards the mean excess per rank of a first, greedy ``fill_holes``."""
    trial = copy_of(packing)
    fill_holes(trial, np.inf, cands, holes, capacity)
    fill_holes(packing, trial.excess.mean(), cands, holes, capacity)
