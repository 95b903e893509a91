"""Plain LPT over one step's candidates: the reference every plan is measured against, and where
``plan_step`` starts from.

Longest (so costliest) first, each sample goes to the least costly rank (ties: the lowest) that has a
micro-batch with room for it, into its first micro-batch with room; a sample no micro-batch has room
for is deferred. With two capacities, costliest first and room for tokens and patches (``_fit.py``).

The kernels work on the candidates in sorted order, and a placement of them (``_placement.py``).
"""

from __future__ import annotations

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.kernels.trees import new_min_tree, set_key
from pipeline.planning.scheduler._fit import lpt_place_two
from pipeline.planning.scheduler._heap import pop, push
from pipeline.planning.scheduler._placement import Candidates, Grid, Placement, Samples, move_tokens
from pipeline.planning.scheduler._sort import costliest_first, longest_first


@kernel
def candidates(lengths: np.ndarray, step_tokens: np.int64) -> tuple[int, int]:
    """The longest prefix of ``lengths`` whose tokens fit in ``step_tokens``: its size and longest sample."""
    limit = 0
    held = np.int64(0)
    longest = 0
    while limit < lengths.shape[0] and held + lengths[limit] <= step_tokens:
        held += lengths[limit]
        longest = max(longest, lengths[limit])
        limit += 1
    return limit, longest


@kernel
def candidates_two(samples: Samples, grid: Grid) -> int:
    """The longest prefix of the samples whose tokens and patches both fit the step: its size."""
    slots = np.int64(grid.ranks) * grid.micro
    step_tokens, step_patches = slots * grid.capacity, slots * grid.patch_capacity
    limit = 0
    tokens = patches = np.int64(0)
    while (
        limit < samples.lengths.shape[0]
        and tokens + samples.lengths[limit] <= step_tokens
        and patches + samples.patches[limit] <= step_patches
    ):
        tokens += samples.lengths[limit]
        patches += samples.patches[limit]
        limit += 1
    return limit


@kernel
def micro_bits(n_micro: int) -> int:
    """Bits of ``at`` that hold the micro-batch."""
    shift = 0
    while (1 << shift) < n_micro:
        shift += 1
    return shift


def at_dtype(n_ranks: int, n_micro: int) -> type:
    """int32 where every ``rank << shift | micro_batch`` fits it, else int64: half the memory traffic."""
    return np.int32 if (n_ranks - 1) << (n_micro - 1).bit_length() <= 2**31 - 1 else np.int64


@kernel
def lpt_place(cands: Candidates, plan: Placement, grid: Grid) -> None:
    """Place the candidates (sorted, longest first) by LPT, in place: ``at`` and the rank and micro-batch totals.

    A rank too full for the current length is parked by its room (the free tokens of its emptiest
    micro-batch) and comes back once lengths fall to its room: lengths never grow along the order.
    """
    n_ranks, n_micro = grid.ranks, grid.micro
    tokens = plan.tokens
    least = np.empty(n_ranks, np.int64)  # tokens of the emptiest micro-batch: the rank's room is capacity - least
    by_cost = new_min_tree(n_ranks)
    for r in range(n_ranks):
        least[r] = tokens[r * n_micro : (r + 1) * n_micro].min()
        set_key(by_cost, r, plan.rank_cost[r])
    parked_least = np.zeros(n_ranks, np.int64)  # the heap of parked ranks, most room first, is keyed by this
    parked = np.empty(n_ranks, np.int64)
    n_parked = 0
    for k in range(cands.length.shape[0]):
        length = np.int64(cands.length[k])
        fits = grid.capacity - length  # a micro-batch has room when it holds at most this
        while n_parked > 0 and least[parked[0]] <= fits:
            r, n_parked = pop(parked, n_parked, parked_least)
            set_key(by_cost, r, plan.rank_cost[r])
        while by_cost.keys[0] < np.inf and least[by_cost.ids[0]] > fits:
            r = by_cost.ids[0]
            set_key(by_cost, r, np.inf)
            parked_least[r] = least[r]
            n_parked = push(parked, n_parked, r, parked_least)
        if by_cost.keys[0] == np.inf:
            plan.at[k] = -1
            continue
        r = by_cost.ids[0]
        base = r * n_micro
        m = 0
        while tokens[base + m] > fits:
            m += 1
        held = tokens[base + m]
        move_tokens(plan, r, base + m, length, cands.cost[k])
        plan.at[k] = (r << grid.shift) | m
        if held == least[r]:  # it was an emptiest micro-batch: the room may have shrunk
            least[r] = tokens[base : base + n_micro].min()
        set_key(by_cost, r, plan.rank_cost[r])


@kernel
def lpt_kernel(samples: Samples, grid: Grid, at: np.ndarray) -> tuple[Candidates, Placement]:
    """LPT over the candidates (the longest prefix that fits the step; the rest deferred). ``at`` is scratch
    of the samples' size: int32 where ``rank << shift | micro_batch`` fits (``at_dtype``), else int64.
    Returns the candidates in sorted order (``longest_first``, or ``costliest_first`` with two capacities)
    and their placement."""
    n_ranks, n_micro = grid.ranks, grid.micro
    if grid.patch_capacity > 0:
        limit = candidates_two(samples, grid)
        cands = Candidates(*costliest_first(samples, limit))
    else:
        limit, longest = candidates(samples.lengths, np.int64(n_ranks) * n_micro * grid.capacity)
        cands = Candidates(
            *longest_first(samples.lengths, samples.costs, limit, longest), samples.patches, samples.encoder
        )
    plan = Placement(
        at[:limit],
        np.zeros(n_ranks, np.float64),
        np.zeros(n_ranks * n_micro, np.int64),
        np.zeros(n_ranks * n_micro, np.float64),
        np.zeros(n_ranks * n_micro, np.int64),
    )
    if grid.patch_capacity > 0:
        lpt_place_two(cands, plan, grid)
    else:
        lpt_place(cands, plan, grid)
    return cands, plan


@kernel
def by_index(n: int, order: np.ndarray, at: np.ndarray, shift: int) -> tuple[np.ndarray, np.ndarray]:
    """``rank`` and ``micro`` of samples ``0..n-1`` (int32, -1 when deferred) from ``at`` in sorted order."""
    rank = np.empty(n, np.int32)
    micro = np.empty(n, np.int32)
    rank[order.shape[0] :] = -1
    micro[order.shape[0] :] = -1
    low_bits = (1 << shift) - 1
    for k in range(order.shape[0]):
        slot = at[k]
        rank[order[k]] = slot >> shift if slot >= 0 else -1
        micro[order[k]] = slot & low_bits if slot >= 0 else -1
    return rank, micro
