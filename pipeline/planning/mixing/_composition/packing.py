"""Packing a step with window samples where short samples are too few to fill around the groups of long ones.

Where a source's short samples cannot fill its allowance (a window of mostly long samples: lengths uniform
up to the context, or long documents that hold most of the tokens), the groups leave holes of a few
thousand tokens that only the window's shortest samples fit, and those run out: every step takes them,
few arrive. Two numba kernels pack such steps, and the options they make compete with the grouped ones
(``options``): ``fill_holes`` packs the holes of a grouping (``groups`` calls it), ``pack_bins`` packs
whole micro-batches and deals them to ranks.

**Holes of a grouping** (``fill_holes``). The samples every option holds (``first``: deferred and due
short samples, sources without a window) go into the fullest micro-batch with room of the rank of least
excess. Then, while the step holds less than ``goal`` tokens, the rank of least excess with room for the
shortest candidate left takes a candidate (long or short) from a source with allowance left, into its
emptiest micro-batch: the longest that fits, or with a finite ``target`` excess per rank, the longest
that leaves the rest of the hole fillable by one more sample without passing the rank's share of the
target for that hole; the shortest that fits where none is that short.

The hole of ``h`` tokens with excess gap ``G`` is filled by one sample where ``e(h) <= G``; else the first
of two samples ``h/2 + x`` and ``h/2 - x`` with ``e(h/2 + x) + e(h/2 - x) <= G``, that is
``a*(h*h/2 + 2*x*x) + b*h + 2*g <= G`` (a sample of ``L`` tokens has excess ``e(L) = a*L*L + b*L + g``).

**Whole micro-batches** (``pack_bins``). Packing one micro-batch at a time with the longest window sample
that fits its hole, until nothing fits, leaves holes no longer than the gaps between the window's lengths
instead (best-fit decreasing: the window's longest samples go first, so the short ones are not used up).
The micro-batches are filled unassigned to ranks, and then dealt: the costliest first, each to the least
costly rank that has a micro-batch free (LPT over whole micro-batches, ``micro_batches`` to a rank). With
several micro-batches a rank that balances the step; with one, every micro-batch is a rank and costs what
it holds, so this option mostly wins where ranks hold several (the scoring decides). The samples every
option holds go first: the seeds and ``first``, longest first, each into the first micro-batch with room.

**Free lists** (``Free``). Both kernels search the candidates not taken yet in order of length, as two
path-compressed lists: the first free position at or after ``j``, and the last at or before it.

Every tie is broken by index, so the result is the same on any machine.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.kernels.trees import (
    RoomTrees,
    SlotRooms,
    least_with_room,
    leftmost_above,
    new_min_tree,
    room_trees,
    set_key,
    set_leaf,
    update_rank,
)
from pipeline.planning.mixing._composition.kernel_arrays import (
    Grid,
    Holes,
    Packing,
    Samples,
    as_grid,
    as_holes,
    as_samples,
    fullest_with_room,
    take_candidate,
    token_rooms,
)
from pipeline.planning.mixing._composition.values import HoleFill, Longs, Slots
from pipeline.planning.scheduler import CostModel
from pipeline.planning.shape import StepShape


class Free(NamedTuple):
    """``by_length`` lists the candidates by increasing length and ``length`` holds their lengths in that
    order; ``next_free(up, j)`` is the first free position ``>= j`` (``n`` for none), and
    ``next_free(down, p + 1) - 1`` the last ``<= p`` (``down`` is shifted by one: 0 is "none")."""

    by_length: np.ndarray
    length: np.ndarray
    up: np.ndarray
    down: np.ndarray


@kernel
def free_lists(by_length: np.ndarray, cand_length: np.ndarray) -> Free:
    n = len(by_length)
    length = np.empty(n, np.int64)
    for j in range(n):
        length[j] = cand_length[by_length[j]]
    return Free(by_length, length, np.arange(n + 1), np.arange(n + 1))


@kernel
def next_free(skip: np.ndarray, j: int) -> int:
    """The first position >= ``j`` not taken yet in a path-compressed list ``skip``."""
    root = j
    while skip[root] != root:
        root = skip[root]
    while skip[j] != root:
        nxt = skip[j]
        skip[j] = root
        j = nxt
    return root


@kernel
def drop_position(free: Free, j: int) -> None:
    """Take position ``j`` out of both lists."""
    free.up[j] = j + 1
    free.down[j + 1] = j


@kernel
def longest_free(free: Free, limit: float, left: np.ndarray, source: np.ndarray) -> int:
    """One past the position of the longest free candidate of at most ``limit`` tokens whose source has
    allowance ``left``, or 0 for none; candidates of sources without allowance are dropped on the way (an
    allowance only shrinks)."""
    p = next_free(free.down, int(np.searchsorted(free.length, limit, side="right")))
    while p > 0 and left[source[free.by_length[p - 1]]] <= 0:
        drop_position(free, p - 1)
        p = next_free(free.down, p - 1)
    return p


@kernel
def fill_holes(packing: Packing, target: float, cands: Samples, holes: Holes, capacity: int) -> None:
    """Pack the holes (the module's docstring), in place."""
    bins = packing.bins
    slots = token_rooms(bins, capacity)
    trees = room_trees(packing.excess, slots)
    total = float(bins.sum()) + _place_first(packing, trees, slots, holes.first, capacity)
    free = free_lists(holes.by_length, cands.length)
    for j in range(len(free.by_length)):
        if packing.chosen[free.by_length[j]]:
            drop_position(free, j)
    while total < holes.goal:
        j = _shortest_free(free, packing.left, cands.source)
        if j >= len(free.by_length):
            return
        r = least_with_room(trees, slots, np.int64(free.length[j]), np.int64(0))
        if r < 0:
            return
        m = int(np.argmin(bins[r]))
        p = longest_free(free, _longest_for(packing, r, m, target, holes.excess, capacity), packing.left, cands.source)
        if p == 0:  # nothing as short as the target wants: the shortest that fits
            p = j + 1
        c = free.by_length[p - 1]
        drop_position(free, p - 1)
        take_candidate(packing, cands, c, r, m)
        total += cands.length[c]
        update_rank(trees, slots, r, packing.excess[r])


@kernel
def _place_first(packing: Packing, trees: RoomTrees, slots: SlotRooms, first: np.ndarray, capacity: int) -> float:
    """The ``first`` samples, longest first, each into the fullest micro-batch with room of the rank of
    least excess with room (ties: the lowest rank); returns their tokens, placed or not."""
    bins = packing.bins
    tokens = 0.0
    for i in np.argsort(-first, kind="mergesort"):
        r = least_with_room(trees, slots, np.int64(first[i]), np.int64(0))
        if r >= 0:
            m = fullest_with_room(bins, r, first[i], capacity)
            bins[r, m] += first[i]
            packing.first_slot[i] = r * bins.shape[1] + m
            update_rank(trees, slots, r, packing.excess[r])
        tokens += first[i]
    return tokens


@kernel
def _shortest_free(free: Free, left: np.ndarray, source: np.ndarray) -> int:
    """The first free position whose source has allowance left (``len(by_length)`` for none); candidates of
    sources without allowance are dropped on the way."""
    n = len(free.by_length)
    j = next_free(free.up, 0)
    while j < n and left[source[free.by_length[j]]] <= 0:
        drop_position(free, j)
        j = next_free(free.up, j + 1)
    return j


@kernel
def _longest_for(packing: Packing, r: int, m: int, target: float, excess: np.ndarray, capacity: int) -> float:
    """The longest sample micro-batch ``m`` of rank ``r`` takes: its hole, or with a finite ``target``, what
    keeps the rest of the hole fillable within the rank's share of the target for it."""
    bins = packing.bins
    hole = capacity - bins[r, m]
    longest = np.float64(hole)
    if target < np.inf:
        holes = capacity * bins.shape[1] - bins[r].sum()
        gap = (target - packing.excess[r]) * hole / holes
        a, b, g = excess[0], excess[1], excess[2]
        if a * hole * hole + b * hole + g > gap:  # one sample over the hole passes the target
            spare = gap - (a * hole * hole / 2 + b * hole + 2 * g)
            longest = hole / 2 + (np.sqrt(spare / (2 * a)) if spare > 0 and a > 0 else 0.0)
    return longest


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
