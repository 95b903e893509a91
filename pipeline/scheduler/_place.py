"""Longest first onto the least costly rank with room (LPT), one sample at a time: for the large samples.

Rank ``r``'s micro-batch ``m`` lives at flat position ``r * n_micro + m`` of the per-micro-batch arrays.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pipeline.scheduler._heaps import new_min_tree, pop, push, set_key


@njit(cache=True, inline="always")
def micro_with_room(tokens: np.ndarray, micro_cost: np.ndarray, base: int, n_micro: int, fits: int) -> int:
    """The least costly micro-batch of the rank at ``base`` holding at most ``fits`` tokens, or -1."""
    best = -1
    for m in range(n_micro):
        held = tokens[base + m]
        if held <= fits and (
            best < 0
            or micro_cost[base + m] < micro_cost[base + best]
            or (micro_cost[base + m] == micro_cost[base + best] and held < tokens[base + best])
        ):
            best = m
    return best


@njit(cache=True)
def place_longest_first(
    items: np.ndarray,
    lengths: np.ndarray,
    alpha: float,
    beta: float,
    at: np.ndarray,
    shift: int,
    rank_cost: np.ndarray,
    tokens: np.ndarray,
    micro_cost: np.ndarray,
    capacity: int,
    cost_cap: float,
) -> int:
    """Place ``items`` (by non-increasing length) each on the least costly rank with room, in place:
    ``at[i] = rank << shift | micro_batch`` for a placed item ``i``, -1 for the others. Costs
    are ``alpha*L^2 + beta*L``, computed here.

    A sample is deferred when no micro-batch has room, or when it would lift its rank above
    ``cost_cap`` while a cheaper rank is too full for it: token capacity, not granularity, is then
    what unbalances the step. Returns the number deferred for balance.

    A rank too full for the current length is parked by room and comes back once lengths fall to its
    room; lengths never grow along ``items``, so each step costs O(log R + M).
    """
    n_ranks = rank_cost.shape[0]
    n_micro = tokens.shape[0] // n_ranks
    room = np.empty(n_ranks, np.int64)
    by_cost, by_cost_id, leaves = new_min_tree(n_ranks)
    for r in range(n_ranks):
        room[r] = capacity - tokens[r * n_micro : (r + 1) * n_micro].min()
        set_key(by_cost, by_cost_id, leaves, r, rank_cost[r])
    parked_cost, parked_cost_id, _ = new_min_tree(n_ranks)
    neg_room = np.zeros(n_ranks, np.int64)
    by_room = np.empty(n_ranks, np.int64)
    by_room_size = 0
    deferred_for_balance = 0
    item_lengths = lengths[items]
    item_costs = np.empty(items.shape[0], np.float64)
    for k in range(items.shape[0]):
        x = np.float64(item_lengths[k])
        item_costs[k] = (alpha * x) * x + beta * x  # as CostModel.costs
    for k in range(items.shape[0]):
        length = item_lengths[k]
        cost = item_costs[k]
        while by_room_size > 0 and room[by_room[0]] >= length:
            r, by_room_size = pop(by_room, by_room_size, neg_room)
            set_key(parked_cost, parked_cost_id, leaves, r, np.inf)
            set_key(by_cost, by_cost_id, leaves, r, rank_cost[r])
        while by_cost[1] < np.inf and room[by_cost_id[1]] < length:
            r = by_cost_id[1]
            set_key(by_cost, by_cost_id, leaves, r, np.inf)
            set_key(parked_cost, parked_cost_id, leaves, r, rank_cost[r])
            neg_room[r] = -room[r]
            by_room_size = push(by_room, by_room_size, r, neg_room)
        if by_cost[1] == np.inf:
            at[items[k]] = -1
            continue
        r = by_cost_id[1]
        if rank_cost[r] + cost > cost_cap and parked_cost[1] < rank_cost[r]:
            deferred_for_balance += 1
            at[items[k]] = -1
            continue
        base = r * n_micro
        best = micro_with_room(tokens, micro_cost, base, n_micro, capacity - length)
        at[items[k]] = (r << shift) | best
        tokens[base + best] += length
        micro_cost[base + best] += cost
        rank_cost[r] += cost
        room[r] = capacity - tokens[base : base + n_micro].min()
        set_key(by_cost, by_cost_id, leaves, r, rank_cost[r])
    return deferred_for_balance
