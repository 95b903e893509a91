"""The numba kernel that builds one group of long samples per rank up to a level of excess cost.

Seeds go first, the largest first, each onto the rank with the least excess that has room in a
micro-batch (else onto the least loaded rank). Then the rank with the least excess, while more than
``slack`` below the level, takes the candidate with the largest excess that keeps it at most ``slack``
above the level and fits one of its micro-batches; a rank that finds none is closed. A sample goes into
the fullest micro-batch with room for it, which keeps whole micro-batches free for the next long ones.
Every tie is broken by index, so the result is the same on any machine. The rank with the least excess
is found in trees over the ranks (with room for a seed: the scheduler's top-up search; among the open ranks:
a tournament tree), not by a scan of every rank, which at 10,240 ranks made a call cost O(R^2).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pipeline.scheduler._heaps import new_min_tree, set_key
from pipeline.scheduler._topup import update_rank


@njit(cache=True)
def _room(bins: np.ndarray, r: int, length: int, capacity: int) -> int:
    """The fullest micro-batch of rank ``r`` with room for ``length`` tokens; -1 if none."""
    best, best_fill = -1, -1
    for m in range(bins.shape[1]):
        held = bins[r, m]
        if held + length <= capacity and held > best_fill:
            best, best_fill = m, held
    return best


@njit(cache=True)
def rank_trees(excess: np.ndarray, room: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Least excess (ties: lowest rank) and most room in a micro-batch over subtrees of ranks, as
    ``_least_with_room`` searches them: (min_excess, max_room, leaves)."""
    leaves = 1
    while leaves < len(excess):
        leaves *= 2
    min_excess = np.full(2 * leaves, np.inf)
    max_room = np.full(2 * leaves, -1, np.int64)
    for r in range(len(excess)):
        update_rank(min_excess, max_room, leaves, r, excess[r], room[r])
    return min_excess, max_room, leaves


@njit(cache=True)
def _least_with_room(min_excess: np.ndarray, max_room: np.ndarray, leaves: int, length: np.int64) -> int:
    """The rank of least excess with a micro-batch of room ``>= length`` (ties: the lowest), or -1: a
    depth-first search that enters the child of less excess first (the left one on a tie) and prunes
    subtrees without room or without a rank that beats the best so far, by excess and then by rank."""
    best, best_excess = -1, np.inf
    stack = np.empty(128, np.int64)
    stack[0] = 1
    depth = 1
    while depth > 0:
        depth -= 1
        node = stack[depth]
        if max_room[node] < length or min_excess[node] > best_excess:
            continue
        if min_excess[node] == best_excess and _lowest_rank(node, leaves) > best:
            continue
        if node >= leaves:
            best, best_excess = node - leaves, min_excess[node]
            continue
        left, right = 2 * node, 2 * node + 1
        if min_excess[right] < min_excess[left]:
            left, right = right, left
        stack[depth] = right  # popped after the whole of the other child
        stack[depth + 1] = left
        depth += 2
    return best


@njit(cache=True)
def _lowest_rank(node: int, leaves: int) -> int:
    while node < leaves:
        node *= 2
    return node - leaves


@njit(cache=True)
def _next_free(skip: np.ndarray, j: int) -> int:
    """The first position >= ``j`` of the ranked candidates not chosen yet (``skip`` is path-compressed)."""
    root = j
    while skip[root] != root:
        root = skip[root]
    while skip[j] != root:
        nxt = skip[j]
        skip[j] = root
        j = nxt
    return root


@njit(cache=True)
def build_groups_kernel(
    seed_excess: np.ndarray,
    seed_length: np.ndarray,
    cand_excess: np.ndarray,
    cand_length: np.ndarray,
    cand_source: np.ndarray,
    held: np.ndarray,
    order: np.ndarray,
    allowance: np.ndarray,
    level: float,
    slack: float,
    ranks: int,
    micro_batches: int,
    capacity: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(chosen candidates as a bool mask, excess per rank). ``order`` ranks the candidates by decreasing
    excess; ``held`` marks candidates already among the seeds (chosen, never picked again); a candidate
    counts against its source's ``allowance`` (tokens), which only the last one picked from a source may
    overshoot."""
    excess = np.zeros(ranks)
    bins = np.zeros((ranks, micro_batches), dtype=np.int64)
    min_excess, max_room, leaves = rank_trees(excess, np.full(ranks, capacity, np.int64))
    for i in np.argsort(-seed_excess, kind="mergesort"):
        length = seed_length[i]
        target = _least_with_room(min_excess, max_room, leaves, np.int64(length))
        if target < 0:
            target = int(np.argmin(excess))
        else:
            bins[target, _room(bins, target, length, capacity)] += length
        excess[target] += seed_excess[i]
        update_rank(min_excess, max_room, leaves, target, excess[target], capacity - bins[target].min())

    n = len(order)
    chosen = held.copy()
    left = allowance.astype(np.float64)
    ranked = np.empty(n)
    skip = np.arange(n + 1)
    for j in range(n):
        ranked[j] = -cand_excess[order[j]]  # increasing
        if held[order[j]]:
            skip[j] = j + 1
    # The open ranks by excess (ties: lowest rank); a closed rank's key is +inf.
    by_excess, by_excess_id, inner = new_min_tree(ranks)
    for k in range(ranks):
        set_key(by_excess, by_excess_id, inner, k, excess[k])
    while by_excess[0] < np.inf:
        r = by_excess_id[0]
        if level - excess[r] <= slack:
            set_key(by_excess, by_excess_id, inner, r, np.inf)
            continue
        j = _next_free(skip, int(np.searchsorted(ranked, excess[r] - level - slack)))
        pick, pick_m = -1, -1
        while j < n:
            c = order[j]
            if left[cand_source[c]] > 0:
                m = _room(bins, r, cand_length[c], capacity)
                if m >= 0:
                    pick, pick_m = j, m
                    break
            else:  # an allowance only shrinks: no rank takes this candidate any more
                skip[j] = j + 1
            j = _next_free(skip, j + 1)
        if pick < 0:
            set_key(by_excess, by_excess_id, inner, r, np.inf)
            continue
        c = order[pick]
        skip[pick] = pick + 1
        chosen[c] = True
        bins[r, pick_m] += cand_length[c]
        excess[r] += cand_excess[c]
        left[cand_source[c]] -= cand_length[c]
        set_key(by_excess, by_excess_id, inner, r, excess[r])
    return chosen, excess
