"""The oldest-first repair: no deferred sample may have a newer placed sample at least as long."""

from __future__ import annotations

import numpy as np
from numba import njit

from pipeline.scheduler._heaps import leftmost_above, set_leaf


@njit(cache=True)
def prefer_older(
    limit: int,
    lengths: np.ndarray,
    costs: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    tokens: np.ndarray,
    micro_cost: np.ndarray,
    rank_cost: np.ndarray,
    n_micro: int,
) -> int:
    """Swap deferred samples into the places of newer, at least as long placed samples, in place.

    Only the candidates ``0..limit-1`` take part (later ones are newer than every placed sample). Afterwards
    no deferred sample ``i`` has a placed ``j > i`` with ``lengths[j] >= lengths[i]``.
    Each swap takes the shortest such ``j`` (the newest among equals), so tokens and costs of the
    micro-batch and rank can only fall. Returns the number of swaps.
    """
    n = limit
    longest = 0
    for i in range(n):
        longest = max(longest, lengths[i])
    # Group of a length among the distinct lengths present, longest = 0.
    group_of = np.zeros(longest + 1, np.int64)
    for i in range(n):
        group_of[lengths[i]] = 1
    n_groups = 0
    for length in range(longest, -1, -1):
        present = group_of[length]
        group_of[length] = n_groups
        n_groups += present
    group = np.empty(n, np.int64)
    for i in range(n):
        group[i] = group_of[lengths[i]]
    # Placed samples grouped by length (longest group first), by increasing index within a group.
    group_end = np.zeros(n_groups, np.int64)
    for i in range(n):
        group_end[group[i]] += rank[i] >= 0
    for g in range(1, n_groups):
        group_end[g] += group_end[g - 1]
    group_begin = np.empty(n_groups, np.int64)
    group_begin[0] = 0
    group_begin[1:] = group_end[:-1]
    group_end[:] = group_begin
    stack = np.empty(n, np.int64)
    for i in range(n):
        if rank[i] >= 0:
            stack[group_end[group[i]]] = i
            group_end[group[i]] += 1

    # Max segment tree over positions by increasing length (position = n_groups - 1 - group),
    # each leaf holding the newest placed sample of that length, or -1.
    leaves = 1
    while leaves < n_groups:
        leaves *= 2
    tree = np.full(2 * leaves, -1, np.int64)
    for g in range(n_groups):
        if group_end[g] > group_begin[g]:
            tree[leaves + n_groups - 1 - g] = stack[group_end[g] - 1]
    for node in range(leaves - 1, 0, -1):
        tree[node] = max(tree[2 * node], tree[2 * node + 1])

    swaps = 0
    for i in range(n):
        if tree[1] <= i:
            break
        if rank[i] >= 0:
            continue
        position = leftmost_above(tree, leaves, n_groups - 1 - group[i], i)
        if position < 0:
            continue
        g = n_groups - 1 - position
        group_end[g] -= 1
        j = stack[group_end[g]]
        set_leaf(tree, leaves, position, stack[group_end[g] - 1] if group_end[g] > group_begin[g] else -1)
        r = rank[j]
        slot = r * n_micro + micro[j]
        tokens[slot] += lengths[i] - lengths[j]
        micro_cost[slot] += costs[i] - costs[j]
        rank_cost[r] += costs[i] - costs[j]
        rank[i] = r
        micro[i] = micro[j]
        rank[j] = -1
        micro[j] = -1
        swaps += 1
    return swaps
