"""Plain LPT over one step's candidates: the reference every plan is measured against, and where
``plan_step`` starts from.

Costliest first (with tokens only, longest first: cost follows length), each sample goes to the least
costly rank (ties: the lowest) that has a micro-batch with room for it, of every kind (tokens; patches where
a micro-batch bounds them), into its first micro-batch with room; a sample no micro-batch has room for is
deferred.

The kernels work on the candidates in sorted order, and a placement of them (``_placement.py``).
"""

from __future__ import annotations

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.kernels.trees import first_fit, least_with_room, room_trees, update_rank
from pipeline.planning.scheduler._placement import Candidates, Grid, Placement, Samples, on_base, rooms
from pipeline.planning.scheduler._sort import costliest_first, longest_first


@kernel
def candidates(samples: Samples, grid: Grid) -> tuple[int, int]:
    """The longest prefix of the samples whose tokens (and patches, where a micro-batch bounds them) fit the
    step: its size and longest sample."""
    slots = np.int64(grid.ranks) * grid.micro
    step_tokens, step_patches = slots * grid.capacity, slots * grid.patch_capacity
    lengths = samples.lengths
    limit = 0
    tokens = patches = np.int64(0)
    longest = 0
    while limit < lengths.shape[0] and tokens + lengths[limit] <= step_tokens:
        if grid.patch_capacity > 0:
            if patches + samples.patches[limit] > step_patches:
                break
            patches += samples.patches[limit]
        tokens += lengths[limit]
        longest = max(longest, lengths[limit])
        limit += 1
    return limit, longest


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
    """Place the candidates (sorted, costliest first) by LPT, in place: each to the least costly rank with a
    micro-batch with room for it (ties: the lowest, ``least_with_room``), into its first such micro-batch
    (``first_fit``); a sample no micro-batch has room for is deferred."""
    slots = rooms(plan, grid)
    trees = room_trees(plan.rank_cost, slots)
    # The loop reads the arrays it needs as locals: each array a kernel call is handed costs a reference count.
    length, cost, sample_patches, at = cands.length, cands.cost, cands.patches, plan.at
    tokens, patches, micro_cost, rank_cost = plan.tokens, plan.patches, plan.micro_cost, plan.rank_cost
    two = grid.patch_capacity > 0
    for k in range(length.shape[0]):
        need, need_patches = np.int64(length[k]), sample_patches[k] if two else np.int64(0)
        r = least_with_room(trees, slots, need, need_patches)
        if r < 0:
            at[k] = -1
            continue
        m = first_fit(slots, r, need, need_patches)
        slot = r * grid.micro + m
        tokens[slot] += need
        micro_cost[slot] += cost[k]
        rank_cost[r] += cost[k]
        if two:
            patches[slot] += need_patches
        at[k] = (r << grid.shift) | m
        update_rank(trees, slots, r, rank_cost[r])


@kernel
def lpt_kernel(samples: Samples, grid: Grid, at: np.ndarray, base: Placement) -> tuple[Candidates, Placement]:
    """LPT over the candidates (the longest prefix that fits the step; the rest deferred). ``at`` is scratch
    of the samples' size: int32 where ``rank << shift | micro_batch`` fits (``at_dtype``), else int64.
    Returns the candidates in sorted order (``longest_first``, or ``costliest_first`` with two capacities)
    and their placement."""
    limit, longest = candidates(samples, grid)
    if grid.patch_capacity > 0:
        cands = Candidates(*costliest_first(samples, limit))
    else:
        cands = Candidates(
            *longest_first(samples.lengths, samples.costs, limit, longest), samples.patches, samples.encoder
        )
    plan = on_base(at[:limit], base)
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
