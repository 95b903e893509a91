"""The arrays a step's plan is made of, as the kernels pass them: the samples as given, the candidates in
sorted order, the step's shape, and a placement with the totals it implies.

Position ``k`` of the sorted candidates holds sample ``order[k]``, longest first (``_sort.py``), or costliest
first where the step has two capacities; ``at[k]`` is where it goes, ``rank << shift | micro_batch``, or -1
while deferred. Rank ``r``'s micro-batch ``m`` lives at flat position ``r * micro + m`` of the
per-micro-batch arrays.

**Rooms.** A micro-batch has a room of each kind: tokens, and vision patches where a step of multimodal
samples bounds them too (``Grid.patch_capacity > 0``). Every kernel places, moves and checks samples against
both through one set of searches (``pipeline.planning.kernels.trees``: ``least_with_room``, ``first_fit``;
``least_costly_fit`` here); with tokens only the patch room is never read. Where patches are bounded the
candidates go costliest first (cost no longer follows length), and the guarantee against starvation is on
both (``_repair.py``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.kernels.trees import SlotRooms, fits


class Samples(NamedTuple):
    """The step's samples in priority order, as ``plan_step`` checked them."""

    lengths: np.ndarray  # int64
    costs: np.ndarray  # float64
    patches: np.ndarray  # int64; empty with one capacity
    encoder: np.ndarray  # float64: the vision encoder's part of ``costs``; empty where not given


class Candidates(NamedTuple):
    order: np.ndarray  # int64, position -> sample
    length: np.ndarray  # int32
    cost: np.ndarray  # float64
    patches: np.ndarray  # int64; empty with one capacity
    encoder: np.ndarray  # float64; empty where not given


class Grid(NamedTuple):
    ranks: int
    micro: int  # micro-batches a rank
    capacity: int  # tokens a micro-batch
    shift: int  # bits of ``at`` that hold the micro-batch
    patch_capacity: int = 0  # patches a micro-batch; 0: one capacity (tokens)


class Placement(NamedTuple):
    at: np.ndarray  # int32 or int64 (``at_dtype``)
    rank_cost: np.ndarray  # float64 by rank
    tokens: np.ndarray  # int64 by micro-batch
    micro_cost: np.ndarray  # float64 by micro-batch
    patches: np.ndarray  # int64 by micro-batch (0 with one capacity)


@kernel
def on_base(at: np.ndarray, base: Placement) -> Placement:
    """A placement with ``at`` as its positions (not read) over what the step holds before its candidates:
    ``base``'s totals, copied (all 0 for a step of its candidates alone; the context-parallel blocks placed
    first otherwise). ``base.at`` is not read."""
    return Placement(at, base.rank_cost.copy(), base.tokens.copy(), base.micro_cost.copy(), base.patches.copy())


def empty_base(ranks: int, micro: int) -> Placement:
    """The base of a step that holds nothing but its candidates."""
    slots = ranks * micro
    return Placement(
        np.zeros(0, np.int64), np.zeros(ranks), np.zeros(slots, np.int64), np.zeros(slots), np.zeros(slots, np.int64)
    )


@kernel
def copy_of(plan: Placement) -> Placement:
    return Placement(
        plan.at.copy(), plan.rank_cost.copy(), plan.tokens.copy(), plan.micro_cost.copy(), plan.patches.copy()
    )


@kernel(inline="always")
def flat_slot(grid: Grid, at: np.int64) -> np.int64:
    """The flat micro-batch position of a placed ``at``."""
    return (at >> grid.shift) * grid.micro + (at & ((1 << grid.shift) - 1))


@kernel(inline="always")
def move_tokens(plan: Placement, rank: np.int64, slot: np.int64, tokens: np.int64, cost: float) -> None:
    """Add ``tokens`` and ``cost`` (either may be negative) to micro-batch ``slot`` and its ``rank``."""
    plan.tokens[slot] += tokens
    plan.micro_cost[slot] += cost
    plan.rank_cost[rank] += cost


@kernel(inline="always")
def move_patches(plan: Placement, grid: Grid, slot: np.int64, cands: Candidates, k: np.int64, sign: int) -> None:
    """Add ``sign`` times candidate ``k``'s patches to micro-batch ``slot`` (nothing with one capacity)."""
    if grid.patch_capacity > 0:
        plan.patches[slot] += sign * cands.patches[k]


@kernel(inline="always")
def rooms(plan: Placement, grid: Grid) -> SlotRooms:
    """What the plan's micro-batches hold, as the room searches read it."""
    return SlotRooms(plan.tokens, plan.patches, grid.micro, grid.capacity, grid.patch_capacity)


@kernel(inline="always")
def patches_of(cands: Candidates, grid: Grid, k: np.int64) -> np.int64:
    """Candidate ``k``'s patches (0 with one capacity, where the candidates carry none)."""
    return cands.patches[k] if grid.patch_capacity > 0 else np.int64(0)


@kernel(inline="always")
def least_costly_fit(plan: Placement, grid: Grid, r: np.int64, length: np.int64, patches: np.int64) -> int:
    """The least costly micro-batch of rank ``r`` with room for ``length`` tokens and ``patches`` patches
    (ties: the fewer tokens, then the first), or -1."""
    slots = rooms(plan, grid)
    base = r * grid.micro
    best = -1
    for m in range(grid.micro):
        slot = base + m
        if fits(slots, slot, length, patches) and (
            best < 0
            or plan.micro_cost[slot] < plan.micro_cost[base + best]
            or (plan.micro_cost[slot] == plan.micro_cost[base + best] and plan.tokens[slot] < plan.tokens[base + best])
        ):
            best = m
    return best


@kernel(inline="always")
def place(cands: Candidates, plan: Placement, grid: Grid, k: np.int64, r: np.int64, m: np.int64) -> None:
    """Put candidate ``k`` into rank ``r``'s micro-batch ``m``: its ``at`` and the totals."""
    slot = r * grid.micro + m
    move_tokens(plan, r, slot, np.int64(cands.length[k]), cands.cost[k])
    move_patches(plan, grid, slot, cands, k, 1)
    plan.at[k] = (r << grid.shift) | m
