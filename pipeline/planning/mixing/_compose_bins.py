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
from numba import njit

from pipeline.planning.mixing._compose_groups import drop_position, longest_free
from pipeline.planning.scheduler._heaps import leftmost_above, new_min_tree, set_key, set_leaf


@njit(cache=True)
def _first_fit(length: np.int64, room: np.ndarray, leaves: int, bins: np.ndarray, capacity: int) -> int:
    """Put ``length`` tokens in the first micro-batch with room (the max tree ``room`` over them); -1 if none."""
    b = leftmost_above(room, leaves, 0, length - 1)  # leaves past the last micro-batch hold -1: never found
    if b < 0:
        return -1
    bins[b] += length
    set_leaf(room, leaves, b, capacity - bins[b])
    return b


@njit(cache=True)
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
    """(chosen candidates as a bool mask, and the micro-batch ``rank * micro_batches + m`` each seed,
    candidate and ``first`` sample went into, -1 for none). ``by_length`` lists the candidates by
    increasing length (older first among equals); a candidate counts against its source's ``allowance``
    (tokens), which only the last one picked from a source may overshoot; picking stops once the step
    holds ``goal`` tokens. A sample of ``L`` tokens costs ``cost[0]*L*L + cost[1]*L + cost[2]``."""
    n_bins = ranks * micro_batches
    bins = np.zeros(n_bins, np.int64)
    leaves = 1
    while leaves < n_bins:
        leaves *= 2
    room = np.full(2 * leaves, -1, np.int64)
    for b in range(n_bins):
        set_leaf(room, leaves, b, capacity)

    # The samples every option holds: longest first, each into the first micro-batch with room.
    n_seeds = len(seed_length)
    held = np.concatenate((seed_length, first))
    held_bin = np.full(len(held), -1, np.int64)
    total = 0.0
    for i in np.argsort(-held, kind="mergesort"):
        held_bin[i] = _first_fit(np.int64(held[i]), room, leaves, bins, capacity)
        if held_bin[i] >= 0:
            total += held[i]

    # Each micro-batch in turn: the longest free candidate that fits its hole, while one does.
    n = len(by_length)
    sorted_length = np.empty(n, np.int64)
    for j in range(n):
        sorted_length[j] = cand_length[by_length[j]]
    up = np.arange(n + 1)
    down = np.arange(n + 1)  # ``next_free`` downwards; position p + 1 stands for p
    left = allowance.astype(np.float64)
    chosen = np.zeros(len(cand_length), np.bool_)
    cand_bin = np.full(len(cand_length), -1, np.int64)
    for b in range(n_bins):
        while total < goal:
            p = longest_free(capacity - bins[b], sorted_length, up, down, left, cand_source, by_length)
            if p == 0:
                break
            c = by_length[p - 1]
            drop_position(up, down, p - 1)
            chosen[c] = True
            cand_bin[c] = b
            bins[b] += cand_length[c]
            left[cand_source[c]] -= cand_length[c]
            total += cand_length[c]

    # The micro-batches' costs, then LPT over them: costliest first, to the least costly rank with one free.
    bin_cost = np.zeros(n_bins)
    for i in range(len(held)):
        if held_bin[i] >= 0:
            bin_cost[held_bin[i]] += _cost(held[i], cost)
    for c in range(len(cand_length)):
        if cand_bin[c] >= 0:
            bin_cost[cand_bin[c]] += _cost(cand_length[c], cost)
    slot_of = np.empty(n_bins, np.int64)
    used = np.zeros(ranks, np.int64)
    rank_cost = np.zeros(ranks)
    by_cost, by_cost_id, inner = new_min_tree(ranks)
    for r in range(ranks):
        set_key(by_cost, by_cost_id, inner, r, 0.0)
    for b in np.argsort(-bin_cost, kind="mergesort"):
        r = by_cost_id[0]
        slot_of[b] = r * micro_batches + used[r]
        used[r] += 1
        rank_cost[r] += bin_cost[b]
        set_key(by_cost, by_cost_id, inner, r, rank_cost[r] if used[r] < micro_batches else np.inf)

    held_slot = np.full(len(held), -1, np.int64)
    for i in range(len(held)):
        if held_bin[i] >= 0:
            held_slot[i] = slot_of[held_bin[i]]
    cand_slot = np.full(len(cand_length), -1, np.int64)
    for c in range(len(cand_length)):
        if cand_bin[c] >= 0:
            cand_slot[c] = slot_of[cand_bin[c]]
    return chosen, held_slot[:n_seeds], cand_slot, held_slot[n_seeds:]


@njit(cache=True, inline="always")
def _cost(length: np.int64, cost: np.ndarray) -> float:
    as_float = np.float64(length)
    return cost[0] * as_float * as_float + cost[1] * as_float + cost[2]
