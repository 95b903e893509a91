"""Packing the micro-batches' holes with window samples where short samples are too few to fill them.

The samples every option holds (``first``: deferred and due short samples, sources without a window) go
into the fullest micro-batch with room of the rank of least excess. Then, while the step holds less than
``goal`` tokens, the rank of least excess with room for the shortest candidate left takes a candidate
(long or short) from a source with allowance left, into its emptiest micro-batch: the longest that fits,
or with a finite ``target`` excess per rank, the longest that leaves the rest of the hole fillable by one
more sample without passing the rank's share of the target for that hole; the shortest that fits where
none is that short.

The hole of ``h`` tokens with excess gap ``G`` is filled by one sample where ``e(h) <= G``; else the first
of two samples ``h/2 + x`` and ``h/2 - x`` with ``e(h/2 + x) + e(h/2 - x) <= G``, that is
``a*(h*h/2 + 2*x*x) + b*h + 2*g <= G`` (a sample of ``L`` tokens has excess ``e(L) = a*L*L + b*L + g``).
"""

from __future__ import annotations

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.kernels.trees import RoomTrees, SlotRooms, least_with_room, room_trees, update_rank
from pipeline.planning.mixing._compose_arrays import Holes, Packing, Samples, take_candidate, token_rooms
from pipeline.planning.mixing._compose_free import Free, drop_position, free_lists, longest_free, next_free


@kernel
def fullest_with_room(bins: np.ndarray, r: int, length: int, capacity: int) -> int:
    """The fullest micro-batch of rank ``r`` with room for ``length`` tokens; -1 if none."""
    best, best_fill = -1, -1
    for m in range(bins.shape[1]):
        held = bins[r, m]
        if held + length <= capacity and held > best_fill:
            best, best_fill = m, held
    return best


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
