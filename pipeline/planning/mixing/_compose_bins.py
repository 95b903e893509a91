"""The numba kernel that packs whole micro-batches from the window, best fit, then deals them to ranks.

Where short samples are too few to fill around groups of long ones (lengths uniform up to the context),
the groups leave holes of a few thousand tokens that only the window's shortest samples fit, and those
run out: every step takes them, few arrive. Packing one micro-batch at a time with the longest window
sample that fits its hole, until nothing fits, leaves holes no longer than the gaps between the
window's lengths instead (best-fit decreasing: the window's longest samples go first, so the short ones
are not used up).

The micro-batches are filled unassigned to ranks, and then dealt: the costliest first, each to the least
costly rank that has a micro-batch free (LPT over whole micro-batches, ``micro_batches`` to a rank). With
several micro-batches a rank that balances the step; with one, every micro-batch is a rank and costs what
it holds, so this option mostly wins where ranks hold several (the scoring decides).

The samples every option holds go first: the seeds and ``first`` (deferred and due samples, sources
without a window), longest first, each into the first micro-batch with room. Every tie is broken by
index, so the result is the same on any machine.
"""

from __future__ import annotations

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.kernels.trees import leftmost_above, new_min_tree, set_key, set_leaf
from pipeline.planning.mixing._compose_arrays import Grid, Holes, Samples, as_grid, as_holes, as_samples
from pipeline.planning.mixing._compose_free import drop_position, free_lists, longest_free
from pipeline.planning.mixing._composition.values import HoleFill, Longs, Slots
from pipeline.planning.scheduler import CostModel
from pipeline.planning.shape import StepShape


def pack_bins(
    seeds: Longs, candidates: Longs, holes: HoleFill, allowance: np.ndarray, shape: StepShape, cost_model: CostModel
) -> tuple[np.ndarray, Slots]:
    """The chosen candidates (a bool mask) and the micro-batch each seed, candidate and ``holes.first``
    sample went into (the module's docstring). A candidate counts against its source's ``allowance``
    (tokens), which only the last one picked from a source may overshoot; picking stops once the step
    holds ``holes.goal`` tokens."""
    cost = np.array([cost_model.alpha, cost_model.beta, cost_model.gamma], dtype=np.float64)
    grid = as_grid(shape)
    chosen, seed_slot, cand_slot, first_slot = _pack_bins(
        seeds.length.astype(np.int64), as_samples(candidates), as_holes(holes), allowance.astype(np.float64), grid, cost
    )
    return chosen, Slots(seed_slot, cand_slot, first_slot)


def pack_bins_kernel(
    seed_length: np.ndarray,
    first: np.ndarray,
    cand_length: np.ndarray,
    cand_source: np.ndarray,
    by_length: np.ndarray,
    allowance: np.ndarray,
    goal: float,
    ranks: int,
    micro_batches: int,
    capacity: int,
    cost: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``pack_bins`` with its arrays apart, as ``tests/test_step_composition.py`` calls it: (chosen, and the
    micro-batch of each seed, candidate and ``first`` sample). A sample of ``L`` tokens costs
    ``cost[0]*L*L + cost[1]*L + cost[2]``."""
    length = np.asarray(cand_length, np.int64)
    cands = Samples(np.zeros(len(length)), length, np.asarray(cand_source, np.int64))
    holes = Holes(np.asarray(by_length, np.int64), np.zeros(0), np.asarray(first, np.int64), float(goal), np.zeros(3))
    grid = Grid(int(ranks), int(micro_batches), int(capacity))
    args = (np.asarray(seed_length, np.int64), cands, holes, np.asarray(allowance, np.float64), grid)
    return _pack_bins(*args, np.asarray(cost, np.float64))


@kernel
def _pack_bins(
    seed_length: np.ndarray, cands: Samples, holes: Holes, allowance: np.ndarray, grid: Grid, cost: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(chosen candidates as a bool mask, and the micro-batch ``rank * micro_batches + m`` each seed,
    candidate and ``holes.first`` sample went into, -1 for none); ``cost`` as ``pack_bins_kernel``'s."""
    n_bins = grid.ranks * grid.micro_batches
    bins = np.zeros(n_bins, np.int64)
    leaves = 1
    while leaves < n_bins:
        leaves *= 2
    room = np.full(2 * leaves, -1, np.int64)
    for b in range(n_bins):
        set_leaf(room, leaves, b, grid.capacity)
    held = np.concatenate((seed_length, holes.first))
    held_bin = np.full(len(held), -1, np.int64)
    total = 0.0
    for i in np.argsort(-held, kind="mergesort"):  # the samples every option holds, longest first
        held_bin[i] = _first_fit(np.int64(held[i]), room, leaves, bins, grid.capacity)
        if held_bin[i] >= 0:
            total += held[i]
    cand_bin = _fill_bins(bins, total, cands, holes, allowance, grid.capacity)
    bin_cost = np.zeros(n_bins)
    for i in range(len(held)):
        if held_bin[i] >= 0:
            bin_cost[held_bin[i]] += _cost(held[i], cost)
    for c in range(len(cand_bin)):
        if cand_bin[c] >= 0:
            bin_cost[cand_bin[c]] += _cost(cands.length[c], cost)
    slot_of = _deal(bin_cost, grid)
    held_slot = _slots(held_bin, slot_of)
    return cand_bin >= 0, held_slot[: len(seed_length)], _slots(cand_bin, slot_of), held_slot[len(seed_length) :]


@kernel
def _first_fit(length: np.int64, room: np.ndarray, leaves: int, bins: np.ndarray, capacity: int) -> int:
    """Put ``length`` tokens in the first micro-batch with room (the max tree ``room`` over them); -1 if none."""
    b = leftmost_above(room, leaves, 0, length - 1)  # leaves past the last micro-batch hold -1: never found
    if b < 0:
        return -1
    bins[b] += length
    set_leaf(room, leaves, b, capacity - bins[b])
    return b


@kernel
def _fill_bins(
    bins: np.ndarray, total: float, cands: Samples, holes: Holes, allowance: np.ndarray, capacity: int
) -> np.ndarray:
    """Each micro-batch in turn takes the longest free candidate that fits its hole, while one does and the
    step holds less than the goal; returns the micro-batch of each candidate, -1 for none."""
    free = free_lists(holes.by_length, cands.length)
    left = allowance.copy()
    cand_bin = np.full(len(cands.length), -1, np.int64)
    for b in range(len(bins)):
        while total < holes.goal:
            p = longest_free(free, capacity - bins[b], left, cands.source)
            if p == 0:
                break
            c = free.by_length[p - 1]
            drop_position(free, p - 1)
            cand_bin[c] = b
            bins[b] += cands.length[c]
            left[cands.source[c]] -= cands.length[c]
            total += cands.length[c]
    return cand_bin


@kernel
def _deal(bin_cost: np.ndarray, grid: Grid) -> np.ndarray:
    """LPT over the micro-batches: the costliest first, each to the least costly rank (ties: the lowest)
    with one free; the slot ``rank * micro_batches + m`` of each."""
    slot_of = np.empty(len(bin_cost), np.int64)
    used = np.zeros(grid.ranks, np.int64)
    rank_cost = np.zeros(grid.ranks)
    by_cost = new_min_tree(grid.ranks)
    for r in range(grid.ranks):
        set_key(by_cost, r, 0.0)
    for b in np.argsort(-bin_cost, kind="mergesort"):
        r = by_cost.ids[0]
        slot_of[b] = r * grid.micro_batches + used[r]
        used[r] += 1
        rank_cost[r] += bin_cost[b]
        set_key(by_cost, r, rank_cost[r] if used[r] < grid.micro_batches else np.inf)
    return slot_of


@kernel
def _slots(bin_of: np.ndarray, slot_of: np.ndarray) -> np.ndarray:
    slots = np.full(len(bin_of), -1, np.int64)
    for i in range(len(bin_of)):
        if bin_of[i] >= 0:
            slots[i] = slot_of[bin_of[i]]
    return slots


@kernel(inline="always")
def _cost(length: np.int64, cost: np.ndarray) -> float:
    as_float = np.float64(length)
    return cost[0] * as_float * as_float + cost[1] * as_float + cost[2]
