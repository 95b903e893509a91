"""The greedy first pass over a step's candidates: their order, plain LPT, the prefix plan and the top-up.

**Order.** The candidates longest first: one stable sort shared by every phase, which then reads samples in order.

Lengths are bounded integers, so a counting sort does it in two passes; where a few very long samples
would make its buckets outnumber the samples, a comparison sort does. Cost grows with length, so the
order is also by cost. With two capacities (multimodal samples, whose encoder cost does not follow their
length) the candidates go costliest first instead (``costliest_first``).

**LPT.** Plain LPT: the reference every plan is measured against, and where
``plan_step`` starts from.

Costliest first (with tokens only, longest first: cost follows length), each sample goes to the least
costly rank (ties: the lowest) that has a micro-batch with room for it, of every kind (tokens; patches where
a micro-batch bounds them), into its first micro-batch with room; a sample no micro-batch has room for is
deferred.

The kernels work on the candidates in sorted order, and a placement of them (``state.py``).

**Prefix plan.** A starvation-safe candidate of one capacity (text steps).

LPT over the longest prefix of the candidates, in age order, that LPT places whole; then, oldest first,
each later candidate shorter than every candidate deferred so far goes to the least costly rank with a
micro-batch with room (``top_up``'s choice, uncapped). Starvation-safe by construction: every sample of the
prefix is placed, and a later one is placed only when it is shorter than every older deferred one.

Where the pool holds a little more than the step, LPT over all of it defers a few long samples and
leaves ranks uneven around them; LPT over the prefix meets no sample it cannot place, and the shorter
samples after it fill the rooms left. The prefix is found by halving (``PREFIX_TRIES`` LPT runs at most,
from the longest prefix down), so it is one that LPT places whole, the longest one of those tried.

**Top-up.** Deferred samples, oldest first, into whatever room a plan left.

Starvation-safe by construction with tokens only: rooms only shrink and costs only grow during the top-up, so
a sample that found no place has no newer sample at least as long placed after it. (With patches too a newer
sample with at least the length and patches may cost less, and find a place under the cap: the plan is made
safe after the top-up, ``repair.prefer_older``.)
"""

from __future__ import annotations

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.kernels.trees import ROOM, first_fit, least_with_room, room_trees, update_rank
from pipeline.planning.scheduler._kernels.state import (
    Candidates,
    Grid,
    Placement,
    Samples,
    least_costly_fit,
    on_base,
    patches_of,
    place,
    rooms,
)


@kernel
def _counting_sort(
    lengths: np.ndarray, costs: np.ndarray, limit: int, longest: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    end = np.zeros(longest + 1, np.int64)  # by bucket ``longest - length``: its end, once the starts are known
    for i in range(limit):
        end[longest - lengths[i]] += 1
    total = 0
    for bucket in range(longest + 1):
        total += end[bucket]
        end[bucket] = total - end[bucket]  # the bucket's start, moved to its end as the samples land
    order = np.empty(limit, np.int64)
    for i in range(limit):
        bucket = longest - lengths[i]
        order[end[bucket]] = i
        end[bucket] += 1
    sorted_length = np.empty(limit, np.int32)
    sorted_cost = np.empty(limit, np.float64)
    first = 0
    for bucket in range(longest + 1):
        if end[bucket] > first:
            cost = costs[order[first]]  # one read a length: samples of one length cost the same
            for k in range(first, end[bucket]):  # a plain loop: a slice assignment costs more per (often empty) bucket
                sorted_length[k] = longest - bucket
                sorted_cost[k] = cost
            first = end[bucket]
    return order, sorted_length, sorted_cost


@kernel
def _comparison_sort(lengths: np.ndarray, costs: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    order = np.argsort(-lengths[:limit], kind="mergesort")
    sorted_length = np.empty(limit, np.int32)
    sorted_cost = np.empty(limit, np.float64)
    for k in range(limit):
        sorted_length[k] = lengths[order[k]]
        sorted_cost[k] = costs[order[k]]
    return order, sorted_length, sorted_cost


@kernel
def longest_first(
    lengths: np.ndarray, costs: np.ndarray, limit: int, longest: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Samples ``0..limit-1`` (none longer than ``longest``) by decreasing length, ties by increasing index:
    ``order`` (position -> sample), and the length (int32: lengths fit a micro-batch) and cost at each
    position, the costs being those given by sample. (Each sort is a function of its own: with both in one,
    numba compiles the counting sort to slower code.)"""
    if longest > 4 * limit + 65536:
        return _comparison_sort(lengths, costs, limit)
    return _counting_sort(lengths, costs, limit, longest)


@kernel
def costliest_first(samples: Samples, limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Samples ``0..limit-1`` by decreasing cost, ties by increasing index, with two capacities (where cost
    no longer follows length): ``order`` and the length (int32), cost, patches and encoder cost (empty where
    the samples have none) at each position."""
    order = np.argsort(-samples.costs[:limit], kind="mergesort")
    sorted_length = np.empty(limit, np.int32)
    sorted_cost = np.empty(limit, np.float64)
    sorted_patches = np.empty(limit, np.int64)
    sorted_encoder = np.empty(limit if samples.encoder.shape[0] else 0, np.float64)
    for k in range(limit):
        sorted_length[k] = samples.lengths[order[k]]
        sorted_cost[k] = samples.costs[order[k]]
        sorted_patches[k] = samples.patches[order[k]]
    for k in range(sorted_encoder.shape[0]):
        sorted_encoder[k] = samples.encoder[order[k]]
    return order, sorted_length, sorted_cost, sorted_patches, sorted_encoder


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


# LPT runs spent on finding the prefix, at most.
PREFIX_TRIES = 24


@kernel
def _lpt_of_prefix(
    cands: Candidates, grid: Grid, like: np.ndarray, prefix: int, base: Placement
) -> tuple[Placement, bool]:
    """LPT over the candidates of the ``prefix`` oldest samples (the others deferred), and whether it
    placed all of them."""
    inside = np.flatnonzero(cands.order < prefix)
    sub = Candidates(cands.order[inside], cands.length[inside], cands.cost[inside], cands.patches, cands.encoder)
    sub_plan = on_base(np.full_like(like[: inside.shape[0]], -1), base)
    lpt_place(sub, sub_plan, grid)
    plan = on_base(np.full_like(like, -1), base)
    whole = True
    for j in range(inside.shape[0]):
        plan.at[inside[j]] = sub_plan.at[j]
        whole = whole and sub_plan.at[j] >= 0
    return Placement(plan.at, sub_plan.rank_cost, sub_plan.tokens, sub_plan.micro_cost, sub_plan.patches), whole


@kernel
def _place_later(cands: Candidates, plan: Placement, grid: Grid, prefix: int) -> None:
    """The candidates after the prefix, oldest first, each shorter than every one deferred so far on the
    least costly rank with a micro-batch with room (ties: the lowest), there its least costly one with
    room. In place."""
    later = np.flatnonzero(cands.order >= prefix)
    later = later[np.argsort(cands.order[later], kind="mergesort")]
    slots = rooms(plan, grid)
    trees = room_trees(plan.rank_cost, slots)
    shortest = np.iinfo(np.int64).max
    for k in later:
        length = np.int64(cands.length[k])
        if length >= shortest or trees.node[1, ROOM] < length:
            shortest = min(shortest, length)
            continue
        r = least_with_room(trees, slots, length, np.int64(0))
        place(cands, plan, grid, k, r, least_costly_fit(plan, grid, r, length, np.int64(0)))
        update_rank(trees, slots, r, plan.rank_cost[r])


@kernel
def prefix_plan(cands: Candidates, grid: Grid, like: np.ndarray, base: Placement) -> Placement:
    """The prefix plan (the module's docstring) of the candidates (one capacity), which LPT does not place
    whole; ``at`` of ``like``'s type."""
    low, high = 0, cands.order.shape[0] - 1  # a prefix of ``low`` is placed whole (or empty), of ``high + 1`` not
    best = on_base(np.full_like(like, -1), base)
    tries = 0
    step = 1
    while low < high and tries < PREFIX_TRIES:  # from the top down, doubling, then halving
        probe = max(high - step + 1, low + 1) if step > 0 else (low + high + 1) // 2
        plan, whole = _lpt_of_prefix(cands, grid, like, probe, base)
        tries += 1
        if whole:
            low, best = probe, plan
            step = 0
        else:
            high = probe - 1
            step = step * 2 if step > 0 else 0
    _place_later(cands, best, grid, low)
    return best


@kernel
def top_up(items: np.ndarray, cands: Candidates, plan: Placement, grid: Grid, cost_cap: float) -> None:
    """Place the deferred samples at positions ``items``, in that order (oldest first), each on the least
    costly rank with a micro-batch with room (ties: the lowest rank, ``least_with_room``), there its least
    costly one with room, unless that lifts a non-empty rank above ``cost_cap`` (then it stays deferred).
    In place.

    The cap is fixed and the choice exact, and ranks only fill up, so where a sample found no place no
    later sample at least as long (so, with tokens only, at least as costly) finds one.
    """
    if items.shape[0] == 0:
        return
    slots = rooms(plan, grid)
    trees = room_trees(plan.rank_cost, slots)
    for k in items:
        length, patches, cost = np.int64(cands.length[k]), patches_of(cands, grid, k), cands.cost[k]
        if trees.node[1, ROOM] < length:
            continue  # no micro-batch has room
        r = least_with_room(trees, slots, length, patches)
        if r < 0 or plan.rank_cost[r] + cost > max(cost_cap, cost):  # an empty rank takes any sample
            continue
        place(cands, plan, grid, k, r, least_costly_fit(plan, grid, r, length, patches))
        update_rank(trees, slots, r, plan.rank_cost[r])
