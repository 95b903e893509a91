"""The top-up: the newest candidates, oldest first, into whatever room the balanced placement left.

A step's candidates fill its tokens to the last sample, and micro-batches never pack perfectly, so
some candidates must wait. Balancing the older ones and topping up with the newest ones makes the
newest wait, and is starvation-safe by construction: rooms only shrink and costs only grow during the
top-up, so a top-up sample that found no place has no newer placed sample at least as long.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pipeline.scheduler._place import micro_with_room


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
        if max_room[node] < length or min_cost[node] >= best_cost:
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
def _update(min_cost: np.ndarray, max_room: np.ndarray, leaves: int, r: int, cost: float, room: np.int64) -> None:
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
    first: int,
    limit: int,
    lengths: np.ndarray,
    costs: np.ndarray,
    rank: np.ndarray,
    micro: np.ndarray,
    rank_cost: np.ndarray,
    tokens: np.ndarray,
    micro_cost: np.ndarray,
    capacity: int,
    cost_cap: float,
) -> None:
    """Place samples ``first..limit-1`` oldest first, each on the least costly rank with a micro-batch with
    room, unless that lifts a non-empty rank above ``cost_cap`` (then it is deferred). In place; arrays
    indexed by sample.

    The cap is fixed and the choice exact, and ranks only fill up, so where a deferred sample found no
    place no newer sample at least as long (so at least as costly) finds one later.
    """
    n_ranks = rank_cost.shape[0]
    n_micro = tokens.shape[0] // n_ranks
    if first >= limit:
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
    for i in range(first, limit):
        length = lengths[i]
        if max_room[1] < length:
            continue  # no micro-batch has room
        r = _cheapest_with_room(min_cost, max_room, leaves, length)
        if rank_cost[r] + costs[i] > max(cost_cap, costs[i]):  # an empty rank takes any sample
            continue
        base = r * n_micro
        best = micro_with_room(tokens, micro_cost, base, n_micro, capacity - length)
        rank[i] = r
        micro[i] = best
        tokens[base + best] += length
        micro_cost[base + best] += costs[i]
        rank_cost[r] += costs[i]
        _update(min_cost, max_room, leaves, r, rank_cost[r], capacity - tokens[base : base + n_micro].min())
