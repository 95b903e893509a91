"""The guarantee against starvation: no deferred sample may have a newer placed sample at least as long.

Plans here are in sorted order (``_lpt.py``): position ``k`` holds sample ``order[k]``, longest first and,
among samples of one length, oldest first; ``at[k]`` is ``rank << shift | micro_batch``, or -1.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pipeline.planning.scheduler._heaps import leftmost_above, set_leaf


@njit(cache=True)
def starvation_safe(order: np.ndarray, sorted_length: np.ndarray, at: np.ndarray) -> bool:
    """Whether no deferred candidate has a newer placed one at least as long (later samples are not
    candidates: they are deferred and newer than every candidate)."""
    newest = -1  # the newest placed sample longer than the current length
    first = 0
    while first < order.shape[0]:
        end = first
        while end < order.shape[0] and sorted_length[end] == sorted_length[first]:
            end += 1
        last_placed = end - 1  # within one length, a later position is a newer sample
        while last_placed >= first and at[last_placed] < 0:
            last_placed -= 1
        for k in range(first, end):
            if at[k] < 0 and (newest > order[k] or last_placed > k):
                return False
        if last_placed >= first:
            newest = max(newest, order[last_placed])
        first = end
    return True


@njit(cache=True)
def deferred_oldest_first(order: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Positions of the deferred candidates, oldest sample first."""
    deferred = np.flatnonzero(at < 0)
    return deferred[np.argsort(order[deferred], kind="mergesort")]


@njit(cache=True)
def prefer_older(
    order: np.ndarray,
    sorted_length: np.ndarray,
    sorted_cost: np.ndarray,
    at: np.ndarray,
    shift: int,
    rank_cost: np.ndarray,
    tokens: np.ndarray,
    micro_cost: np.ndarray,
) -> int:
    """Swap deferred samples into the places of newer, at least as long placed samples, in place, oldest
    deferred sample first, until no deferred sample has a newer placed one at least as long. Each swap
    takes the shortest such sample (the newest among equals), so tokens and costs of the micro-batch and
    rank can only fall; the sample that gives way is newer and may in turn take another's place.
    Returns the number of swaps."""
    n = order.shape[0]
    n_micro = tokens.shape[0] // rank_cost.shape[0]
    low_bits = (1 << shift) - 1
    # Groups: runs of one length, longest first; ``group[k]``: the group of position ``k``.
    group_start = np.empty(n + 1, np.int64)
    group = np.empty(n, np.int32)
    n_groups = 0
    for k in range(n):
        if k == 0 or sorted_length[k] != sorted_length[k - 1]:
            group_start[n_groups] = k
            n_groups += 1
        group[k] = n_groups - 1
    group_start[n_groups] = n
    # Max segment tree over groups by increasing length (leaf n_groups - 1 - g), each leaf holding the
    # newest placed sample of its group, or -1; ``top[g]``: its position.
    leaves = 1
    while leaves < n_groups:
        leaves *= 2
    tree = np.full(2 * leaves, -1, np.int64)
    top = np.empty(n_groups, np.int64)
    for g in range(n_groups):
        k = group_start[g + 1] - 1
        while k >= group_start[g] and at[k] < 0:
            k -= 1
        top[g] = k
        if k >= group_start[g]:
            tree[leaves + n_groups - 1 - g] = order[k]
    for node in range(leaves - 1, 0, -1):
        tree[node] = max(tree[2 * node], tree[2 * node + 1])

    waiting = np.zeros(n, np.int64)  # by sample: its position + 1 while it is deferred and waits its turn
    for k in range(n):
        if at[k] < 0:
            waiting[order[k]] = k + 1
    swaps = 0
    for i in range(n):
        if waiting[i] == 0:
            continue
        if tree[1] <= i:
            break  # no placed sample is newer than this one, nor than any deferred after it
        k = waiting[i] - 1
        g = group[k]
        leaf = leftmost_above(tree, leaves, n_groups - 1 - g, i)
        if leaf < 0:
            continue
        h = n_groups - 1 - leaf
        kj = top[h]
        slot = at[kj]
        r = slot >> shift
        flat = r * n_micro + (slot & low_bits)
        tokens[flat] += np.int64(sorted_length[k]) - np.int64(sorted_length[kj])
        micro_cost[flat] += sorted_cost[k] - sorted_cost[kj]
        rank_cost[r] += sorted_cost[k] - sorted_cost[kj]
        at[k] = slot
        at[kj] = -1
        swaps += 1
        previous = kj - 1
        while previous >= group_start[h] and at[previous] < 0:
            previous -= 1
        top[h] = previous
        set_leaf(tree, leaves, leaf, order[previous] if previous >= group_start[h] else -1)
        waiting[order[kj]] = kj + 1  # newer than ``i``: its turn comes later
    return swaps
