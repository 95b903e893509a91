"""The top-up: deferred samples, oldest first, into whatever room a plan left.

Starvation-safe by construction: rooms only shrink and costs only grow during the top-up, so a sample
that found no place has no newer sample at least as long placed after it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pipeline.planning.scheduler._micro import micro_with_room


@njit(cache=True)
def _cheapest_with_room(min_cost: np.ndarray, max_room: np.ndarray, leaves: int, length: np.int64) -> int:
    """The least costly rank with a micro-batch of room ``>= length`` (ties: the lowest), or -1: a depth-first
    search over the two trees, cheaper subtree first, pruning subtrees without room or not cheaper."""
    best, best_cost = -1, np.inf
    stack = np.empty(128, np.int64)
    stack[0] = 1
    depth = 1
    while depth > 0:
        depth -= 1
        node = stack[depth]
        if max_room[node] < length or min_cost[node] > best_cost:
            continue
        if min_cost[node] == best_cost:
            low = node
            while low < leaves:
                low *= 2
            if low - leaves > best:
                continue
        if node >= leaves:
            best, best_cost = node - leaves, min_cost[node]
            continue
        left, right = 2 * node, 2 * node + 1
        if min_cost[right] < min_cost[left]:
            left, right = right, left
        stack[depth] = right  # visited after the cheaper one
        stack[depth + 1] = left
        depth += 2
    return best


@njit(cache=True)
def update_rank(min_cost: np.ndarray, max_room: np.ndarray, leaves: int, r: int, cost: float, room: np.int64) -> None:
    """Set rank ``r``'s cost and room (free tokens of its emptiest micro-batch), and the subtrees above it."""
    node = leaves + r
    min_cost[node] = cost
    max_room[node] = room
    node >>= 1
    while node >= 1:
        min_cost[node] = min(min_cost[2 * node], min_cost[2 * node + 1])
        max_room[node] = max(max_room[2 * node], max_room[2 * node + 1])
        node >>= 1


@njit(cache=True)
def top_up(
    items: np.ndarray,
    sorted_length: np.ndarray,
    sorted_cost: np.ndarray,
    at: np.ndarray,
    shift: int,
    rank_cost: np.ndarray,
    tokens: np.ndarray,
    micro_cost: np.ndarray,
    capacity: int,
    cost_cap: float,
) -> None:
    """Place the deferred samples at positions ``items``, in that order (oldest first), each on the least
    costly rank with a micro-batch with room, there its least costly one with room, unless that lifts a
    non-empty rank above ``cost_cap`` (then it stays deferred). In place.

    The cap is fixed and the choice exact, and ranks only fill up, so where a sample found no place no
    later sample at least as long (so at least as costly) finds one.
    """
    n_ranks = rank_cost.shape[0]
    n_micro = tokens.shape[0] // n_ranks
    if items.shape[0] == 0:
        return
    leaves = 1
    while leaves < n_ranks:
        leaves *= 2
    min_cost = np.full(2 * leaves, np.inf, np.float64)
    max_room = np.full(2 * leaves, -1, np.int64)
    for r in range(n_ranks):
        min_cost[leaves + r] = rank_cost[r]
        max_room[leaves + r] = capacity - tokens[r * n_micro : (r + 1) * n_micro].min()
    for node in range(leaves - 1, 0, -1):
        min_cost[node] = min(min_cost[2 * node], min_cost[2 * node + 1])
        max_room[node] = max(max_room[2 * node], max_room[2 * node + 1])
    for k in items:
        length = np.int64(sorted_length[k])
        cost = sorted_cost[k]
        if max_room[1] < length:
            continue  # no micro-batch has room
        r = _cheapest_with_room(min_cost, max_room, leaves, length)
        if rank_cost[r] + cost > max(cost_cap, cost):  # an empty rank takes any sample
            continue
        base = r * n_micro
        best = micro_with_room(tokens, micro_cost, base, n_micro, capacity - length)
        at[k] = (r << shift) | best
        tokens[base + best] += length
        micro_cost[base + best] += cost
        rank_cost[r] += cost
        update_rank(min_cost, max_room, leaves, r, rank_cost[r], capacity - tokens[base : base + n_micro].min())
