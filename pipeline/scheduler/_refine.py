"""Refinement restricted to the costliest ranks: move placed samples from them to the cheapest ranks.

Only moves: the set of placed samples, hence the lower bound and the guarantee against starvation,
stays as it is, and every move lowers the larger of the two ranks it touches.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pipeline.scheduler._heaps import new_min_tree, set_key
from pipeline.scheduler._place import micro_with_room

# Cheapest ranks tried for one costly rank before giving up on it.
_TRIES = 8


@njit(cache=True)
def move_from_costliest(
    lengths: np.ndarray,
    costs: np.ndarray,
    limit: int,
    rank: np.ndarray,
    micro: np.ndarray,
    rank_cost: np.ndarray,
    tokens: np.ndarray,
    micro_cost: np.ndarray,
    capacity: int,
    target: float,
    max_moves: int,
) -> int:
    """While the costliest rank is above ``target``, move one of its samples to one of the cheapest ranks
    with room: the sample whose cost is nearest half their difference, below it. Returns the moves.

    ``lengths``, ``costs``, ``rank`` and ``micro`` are indexed by sample (``0..limit-1``)."""
    n_ranks = rank_cost.shape[0]
    n_micro = tokens.shape[0] // n_ranks
    # Each rank's samples, contiguous (so a scan reads memory in order): index, length, cost.
    begin = np.zeros(n_ranks + 1, np.int64)
    for i in range(limit):
        begin[rank[i] + 1] += rank[i] >= 0
    for r in range(n_ranks):
        begin[r + 1] += begin[r]
    count = np.zeros(n_ranks, np.int64)
    member = np.empty(begin[n_ranks], np.int64)
    member_length = np.empty(begin[n_ranks], np.int64)
    member_cost = np.empty(begin[n_ranks], np.float64)
    for i in range(limit):
        r = rank[i]
        if r >= 0:
            slot = begin[r] + count[r]
            member[slot] = i
            member_length[slot] = lengths[i]
            member_cost[slot] = costs[i]
            count[r] += 1
    by_cost, by_cost_id, leaves = new_min_tree(n_ranks)  # cheapest first
    by_neg, by_neg_id, _ = new_min_tree(n_ranks)  # costliest first
    for r in range(n_ranks):
        set_key(by_cost, by_cost_id, leaves, r, rank_cost[r])
        set_key(by_neg, by_neg_id, leaves, r, -rank_cost[r])
    skipped = np.empty(_TRIES, np.int64)
    moves = 0
    while moves < max_moves:
        a = by_neg_id[1]
        if rank_cost[a] <= target:
            break
        moved = False
        n_skipped = 0
        while n_skipped < _TRIES:
            b = by_cost_id[1]
            gap = rank_cost[a] - rank_cost[b]
            if by_cost[1] == np.inf or gap <= 0.0:
                break
            base_b = b * n_micro
            room = capacity - tokens[base_b : base_b + n_micro].min()
            best, best_score = -1, -1.0
            for slot in range(begin[a], begin[a] + count[a]):
                if member_length[slot] <= room and member_cost[slot] < gap:
                    score = min(member_cost[slot], gap - member_cost[slot])
                    if score > best_score:
                        best, best_score = slot, score
            if best < 0 or best_score <= 0.0:
                set_key(by_cost, by_cost_id, leaves, b, np.inf)  # no use to this rank; try the next
                skipped[n_skipped] = b
                n_skipped += 1
                continue
            # A moved sample is not moved again: it leaves its list and joins none.
            last = begin[a] + count[a] - 1
            picked = member[best]
            member[best], member_length[best], member_cost[best] = member[last], member_length[last], member_cost[last]
            count[a] -= 1
            best = picked
            slot = a * n_micro + micro[best]
            tokens[slot] -= lengths[best]
            micro_cost[slot] -= costs[best]
            rank_cost[a] -= costs[best]
            m = micro_with_room(tokens, micro_cost, base_b, n_micro, capacity - lengths[best])
            tokens[base_b + m] += lengths[best]
            micro_cost[base_b + m] += costs[best]
            rank_cost[b] += costs[best]
            rank[best] = b
            micro[best] = m
            for r in (a, b):
                set_key(by_cost, by_cost_id, leaves, r, rank_cost[r])
                set_key(by_neg, by_neg_id, leaves, r, -rank_cost[r])
            moves += 1
            moved = True
            break
        for t in range(n_skipped):
            set_key(by_cost, by_cost_id, leaves, skipped[t], rank_cost[skipped[t]])
        if not moved:
            break
    return moves
