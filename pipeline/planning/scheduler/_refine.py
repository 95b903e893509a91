"""Refinement restricted to the costliest ranks: move placed samples from them to the cheapest ranks.

Only moves: the set of placed samples, hence the lower bound and the guarantee against starvation,
stays as it is, and every move lowers the larger of the two ranks it touches.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pipeline.planning.scheduler._heaps import new_min_tree, set_key
from pipeline.planning.scheduler._micro import micro_with_room

# Cheapest ranks tried for one costly rank before giving up on it.
_TRIES = 8


@njit(cache=True)
def move_from_costliest(
    sorted_length: np.ndarray,
    sorted_cost: np.ndarray,
    at: np.ndarray,
    shift: int,
    rank_cost: np.ndarray,
    tokens: np.ndarray,
    micro_cost: np.ndarray,
    capacity: int,
    target: float,
    max_moves: int,
) -> int:
    """While the costliest rank is above ``target``, move one of its samples to one of the cheapest ranks
    with room: the sample whose cost is nearest half their difference, below it. Only the samples of ranks
    above ``target`` at the start move, each at most once. In place on a plan in sorted order (``at``, see
    ``_lpt.py``); returns the moves."""
    n_ranks = rank_cost.shape[0]
    n_micro = tokens.shape[0] // n_ranks
    low_bits = (1 << shift) - 1
    # The positions of the samples of the ranks above ``target`` (only those give samples away), contiguous
    # by rank. ``begin`` is by rank, empty for the others.
    begin = np.zeros(n_ranks + 1, np.int64)
    for k in range(at.shape[0]):
        if at[k] >= 0 and rank_cost[at[k] >> shift] > target:
            begin[(at[k] >> shift) + 1] += 1
    for r in range(n_ranks):
        begin[r + 1] += begin[r]
    count = np.zeros(n_ranks, np.int64)
    member = np.empty(begin[n_ranks], np.int32)
    for k in range(at.shape[0]):
        if at[k] >= 0 and rank_cost[at[k] >> shift] > target:
            r = at[k] >> shift
            slot = begin[r] + count[r]
            member[slot] = k
            count[r] += 1
    by_cost, by_cost_id, inner = new_min_tree(n_ranks)  # cheapest first
    by_neg, by_neg_id, _ = new_min_tree(n_ranks)  # costliest first
    for r in range(n_ranks):
        set_key(by_cost, by_cost_id, inner, r, rank_cost[r])
        set_key(by_neg, by_neg_id, inner, r, -rank_cost[r])
    skipped = np.empty(_TRIES, np.int64)
    moves = 0
    while moves < max_moves:
        a = by_neg_id[0]
        if rank_cost[a] <= target:
            break
        moved = False
        n_skipped = 0
        while n_skipped < _TRIES:
            b = by_cost_id[0]
            gap = rank_cost[a] - rank_cost[b]
            if by_cost[0] == np.inf or gap <= 0.0:
                break
            base_b = b * n_micro
            room = capacity - tokens[base_b : base_b + n_micro].min()
            best, best_score = -1, -1.0
            for slot in range(begin[a], begin[a] + count[a]):
                cost = sorted_cost[member[slot]]
                if sorted_length[member[slot]] <= room and cost < gap:
                    score = min(cost, gap - cost)
                    if score > best_score:
                        best, best_score = slot, score
            if best < 0 or best_score <= 0.0:
                set_key(by_cost, by_cost_id, inner, b, np.inf)  # no use to this rank; try the next
                skipped[n_skipped] = b
                n_skipped += 1
                continue
            # A moved sample is not moved again: it leaves its list and joins none.
            last = begin[a] + count[a] - 1
            k = member[best]
            member[best] = member[last]
            count[a] -= 1
            length = np.int64(sorted_length[k])
            slot = a * n_micro + (at[k] & low_bits)
            tokens[slot] -= length
            micro_cost[slot] -= sorted_cost[k]
            rank_cost[a] -= sorted_cost[k]
            m = micro_with_room(tokens, micro_cost, base_b, n_micro, capacity - length)
            tokens[base_b + m] += length
            micro_cost[base_b + m] += sorted_cost[k]
            rank_cost[b] += sorted_cost[k]
            at[k] = (b << shift) | m
            for r in (a, b):
                set_key(by_cost, by_cost_id, inner, r, rank_cost[r])
                set_key(by_neg, by_neg_id, inner, r, -rank_cost[r])
            moves += 1
            moved = True
            break
        for t in range(n_skipped):
            set_key(by_cost, by_cost_id, inner, skipped[t], rank_cost[skipped[t]])
        if not moved:
            break
    return moves
