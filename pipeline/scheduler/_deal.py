"""Dealing the small samples: O(1) per sample instead of a heap operation, each rank filled up to a level.

Once the samples left are small next to a rank's cost, which rank takes which of them hardly matters
for balance, as long as no rank goes above the level and the ranks that can still take samples keep
taking them. The ranks that can take the current sample sit in a ring and take the samples in turn
(longest first, so a turn hands out samples of about the same cost). A rank that cannot take the
current sample, for lack of tokens or of cost below the level, leaves the ring and is parked by the
longest sample it can still take; it comes back once the samples are that short. Within a rank, its
micro-batches take its samples in turn the same way (snake order), so no sample scans them all unless
its turn's micro-batch is full.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_NONE = np.iinfo(np.int64).max  # the key of a micro-batch without room


@njit(cache=True, inline="always")
def _cost(alpha: float, beta: float, length: np.int64) -> float:
    x = np.float64(length)
    return (alpha * x) * x + beta * x


@njit(cache=True)
def _longest_within(alpha: float, beta: float, budget: float, room: np.int64, below: np.int64) -> np.int64:
    """The longest length ``< below`` and ``<= room`` whose cost is at most ``budget``, or -1."""
    high = min(room, below - 1)
    if high < 0 or budget < 0.0:
        return -1
    if _cost(alpha, beta, high) <= budget:
        return high
    low = np.int64(0)  # cost(0) == 0 <= budget; cost(high) > budget
    while high - low > 1:
        middle = (low + high) // 2
        if _cost(alpha, beta, middle) <= budget:
            low = middle
        else:
            high = middle
    return low


@njit(cache=True)
def _deal_in_ring_order(
    first: int,
    end: int,
    lengths: np.ndarray,
    slot_of: np.ndarray,
    shift: np.int64,
    ring_rank: np.ndarray,
    rank_cost: np.ndarray,
    tokens: np.ndarray,
    micro_cost: np.ndarray,
    capacity: int,
    level: float,
    alpha: float,
    beta: float,
) -> np.ndarray:
    """``deal`` with the ranks numbered in the ring's first order, so the ring walks memory in order
    (``ring_rank`` maps a ring position back to its rank, for ``slot_of``)."""
    n_ranks = rank_cost.shape[0]
    n_micro = tokens.shape[0] // n_ranks
    left = np.empty(max(end - first, 0), np.int64)
    n_left = 0
    if end <= first:
        return left
    longest = lengths[first]
    ring = np.arange(n_ranks)
    cost_bits = micro_cost.view(np.int64)
    key_shift = np.int64(0)
    while (1 << key_shift) < n_micro:
        key_shift += 1
    low_bits = (np.int64(1) << key_shift) - 1
    in_ring = n_ranks
    bucket = np.full(longest + 1, -1, np.int64)  # parked ranks by the longest sample they can take
    next_parked = np.empty(n_ranks, np.int64)
    sweep = longest  # buckets above ``sweep`` are empty
    dealt = np.zeros(n_ranks, np.int64)  # each rank's turn among its micro-batches, 0..2M-1
    at = 0
    for i in range(first, end):
        length = lengths[i]
        cost = _cost(alpha, beta, length)
        while sweep >= length:
            r = bucket[sweep]
            while r >= 0:
                ring[in_ring] = r
                in_ring += 1
                r = next_parked[r]
            bucket[sweep] = -1
            sweep -= 1
        placed = False
        while in_ring > 0:
            if at >= in_ring:
                at = 0
            r = ring[at]
            base = r * n_micro
            chosen = _NONE
            if rank_cost[r] + cost <= level:
                # The rank's micro-batches take its samples in turn, in snake order (0..M-1, M-1..0), as the
                # ranks do in the ring; when that one has no room, the least costly one with room, ties to
                # the first: a branch-free minimum over keys of the cost's bits (a float64 >= 0 orders like
                # its bits) with the micro-batch in the lowest bits (costs within 2**-46 count as a tie).
                turn = dealt[r]
                snake = turn if turn < n_micro else 2 * n_micro - 1 - turn
                fits = capacity - length
                if tokens[base + snake] <= fits:
                    chosen = snake
                else:
                    for m in range(n_micro):
                        key = ((cost_bits[base + m] >> key_shift) << key_shift) | m
                        chosen = min(chosen, key if tokens[base + m] <= fits else _NONE)
            if chosen != _NONE:
                best = chosen & low_bits
                dealt[r] = dealt[r] + 1 if dealt[r] + 1 < 2 * n_micro else 0
                tokens[base + best] += length
                micro_cost[base + best] += cost
                rank_cost[r] += cost
                slot_of[i] = (ring_rank[r] << shift) | best
                at += 1
                placed = True
                break
            # Park: it cannot take this sample, it may take a shorter one.
            in_ring -= 1
            ring[at] = ring[in_ring]
            room = capacity - tokens[base : base + n_micro].min()
            takes = _longest_within(alpha, beta, level - rank_cost[r], room, length)
            if takes >= 0:
                next_parked[r] = bucket[takes]
                bucket[takes] = r
        if not placed:
            slot_of[i] = -1
            left[n_left] = i
            n_left += 1
    return left[:n_left]


@njit(cache=True)
def deal(
    first: int,
    end: int,
    lengths: np.ndarray,
    at: np.ndarray,
    shift: int,
    rank_cost: np.ndarray,
    tokens: np.ndarray,
    micro_cost: np.ndarray,
    capacity: int,
    level: float,
    alpha: float,
    beta: float,
) -> np.ndarray:
    """Place samples ``first..end-1`` (by non-increasing length, not placed yet) so that no rank goes above
    ``level``, in place: ``at[i] = rank << shift | micro_batch``, -1 where not placed. Each goes to the next
    rank of the ring (which starts with the least costly rank, ties by rank), in that rank's next micro-batch
    (snake order), or its least costly one with room. Returns the samples no rank could take without going
    above ``level`` or over capacity, in the same order. Costs are ``alpha*L^2 + beta*L``, computed here.
    """
    n_ranks = rank_cost.shape[0]
    n_micro = tokens.shape[0] // n_ranks
    ring_rank = np.argsort(rank_cost, kind="mergesort")  # ring position -> rank
    ring_cost = rank_cost[ring_rank]
    ring_tokens = tokens.reshape(n_ranks, n_micro)[ring_rank].ravel()
    ring_micro_cost = micro_cost.reshape(n_ranks, n_micro)[ring_rank].ravel()
    left = _deal_in_ring_order(
        first,
        end,
        lengths,
        at,
        np.int64(shift),
        ring_rank,
        ring_cost,
        ring_tokens,
        ring_micro_cost,
        capacity,
        level,
        alpha,
        beta,
    )
    for position in range(n_ranks):
        r = ring_rank[position]
        rank_cost[r] = ring_cost[position]
        for m in range(n_micro):
            tokens[r * n_micro + m] = ring_tokens[position * n_micro + m]
            micro_cost[r * n_micro + m] = ring_micro_cost[position * n_micro + m]
    return left
