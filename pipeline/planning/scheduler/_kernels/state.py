"""The scheduler kernels' inputs and the state they pass between them: the arguments, checked at the Python
boundary (a ValueError naming the argument and value); the step's samples and grid made from them
(``step_inputs``); the candidates in sorted order; and a placement with the totals it implies.

Position ``k`` of the sorted candidates holds sample ``order[k]``, longest first (``greedy.py``), or costliest
first where the step has two capacities; ``at[k]`` is where it goes, ``rank << shift | micro_batch``, or -1
while deferred. Rank ``r``'s micro-batch ``m`` lives at flat position ``r * micro + m`` of the
per-micro-batch arrays.

**Rooms.** A micro-batch has a room of each kind: tokens, and vision patches where a step of multimodal
samples bounds them too (``Grid.patch_capacity > 0``). Every kernel places, moves and checks samples against
both through one set of searches (``pipeline.planning.kernels.trees``: ``least_with_room``, ``first_fit``;
``least_costly_fit`` here); with tokens only the patch room is never read. Where patches are bounded the
candidates go costliest first (cost no longer follows length), and the guarantee against starvation is on
both (``repair.py``).
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.kernels.trees import SlotRooms, fits
from pipeline.spec.cost import CostModel


def check_positive_int(name: str, value: object, upper: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        msg = f"{name} must be an integer >= 1, got {value!r}"
        raise ValueError(msg)
    if upper is not None and value > upper:
        msg = f"{name} must be <= {upper}, got {value!r}"
        raise ValueError(msg)
    return int(value)


def check_lengths(lengths: object) -> np.ndarray:
    """A 1-D array of non-negative integer lengths, as contiguous int64."""
    array = np.asarray(lengths)
    if array.ndim != 1:
        msg = f"lengths must be 1-D, got shape {array.shape}"
        raise ValueError(msg)
    if not np.issubdtype(array.dtype, np.integer):
        msg = f"lengths must have an integer dtype, got {array.dtype}"
        raise ValueError(msg)
    array = np.ascontiguousarray(array, dtype=np.int64)
    if array.size and int(array.min()) < 0:  # the index is looked for only on error
        first = int(np.flatnonzero(array < 0)[0])
        msg = f"lengths must be >= 0, got lengths[{first}] = {int(array[first])}"
        raise ValueError(msg)
    return array


def check_step(
    lengths: object, ranks: object, micro_batches: object, capacity: object
) -> tuple[np.ndarray, int, int, int]:
    """The arguments of a step's plan, checked: lengths as contiguous int64, none longer than a micro-batch."""
    lengths = check_lengths(lengths)
    ranks = check_positive_int("ranks", ranks)
    micro_batches = check_positive_int("micro_batches", micro_batches)
    capacity = check_positive_int("capacity", capacity, upper=2**31 - 1)
    if lengths.size and int(lengths.max()) > capacity:  # the index is looked for only on error
        too_long = np.flatnonzero(lengths > capacity)
        first = int(too_long[0])
        msg = (
            f"lengths[{first}] = {int(lengths[first])} exceeds capacity {capacity}"
            f" ({too_long.size} sample(s) longer than a micro-batch; split them first)"
        )
        raise ValueError(msg)
    return lengths, ranks, micro_batches, capacity


def check_costs(costs: object, size: int, name: str = "costs") -> np.ndarray:
    """One finite float cost >= 0 per sample, as contiguous float64."""
    array = np.asarray(costs)
    if array.shape != (size,) or not (
        np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    ):
        msg = f"{name} must be numbers, one per sample ({size}), got {array.dtype} of shape {array.shape}"
        raise ValueError(msg)
    array = np.ascontiguousarray(array, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(array) | (array < 0))
    if bad.size:
        msg = f"{name} must be finite and >= 0, got {name}[{int(bad[0])}] = {float(array[bad[0]])!r}"
        raise ValueError(msg)
    return array


def check_patches(patches: object, size: int, patch_capacity: object) -> tuple[np.ndarray | None, int]:
    """Each sample's vision patches (int, >= 0, at most ``patch_capacity`` where that is > 0) as contiguous
    int64 or None, and the capacity as an int >= 0 (0: no limit)."""
    if isinstance(patch_capacity, bool) or not isinstance(patch_capacity, numbers.Integral) or patch_capacity < 0:
        msg = f"patch_capacity must be an integer >= 0 (0: no limit), got {patch_capacity!r}"
        raise ValueError(msg)
    if patches is None:
        return None, int(patch_capacity)
    array = np.asarray(patches)
    if array.shape != (size,) or not np.issubdtype(array.dtype, np.integer):
        msg = f"patches must be integers, one per sample ({size}), got {array.dtype} of shape {array.shape}"
        raise ValueError(msg)
    array = np.ascontiguousarray(array, dtype=np.int64)
    if array.size and int(array.min()) < 0:
        first = int(np.flatnonzero(array < 0)[0])
        msg = f"patches must be >= 0, got patches[{first}] = {int(array[first])}"
        raise ValueError(msg)
    if patch_capacity > 0 and array.size and int(array.max()) > patch_capacity:
        too_many = np.flatnonzero(array > patch_capacity)
        first = int(too_many[0])
        msg = (
            f"patches[{first}] = {int(array[first])} exceeds patch_capacity {patch_capacity}"
            f" ({too_many.size} sample(s) with more patches than a micro-batch holds)"
        )
        raise ValueError(msg)
    return array, int(patch_capacity)


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


class Pass(NamedTuple):
    """What one pass evens out: each rank's ``load`` and each position's ``value`` (cost, encoder cost or LLM
    cost); two other loads by rank and position, and the most of each a rank may hold (``cap``,
    ``third_cap``: ``math.inf`` where the third is not held down)."""

    load: np.ndarray
    value: np.ndarray
    other: np.ndarray
    other_value: np.ndarray
    cap: float
    third: np.ndarray
    third_value: np.ndarray
    third_cap: float


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


_NO_PATCHES = np.zeros(0, np.int64)
_NO_COSTS = np.zeros(0, np.float64)


def step_inputs(
    lengths: np.ndarray,
    shape: tuple[int, int, int],
    cost_model: CostModel,
    costs: object | None,
    patches: object | None,
    patch_capacity: object,
    encoder_costs: object | None = None,
) -> tuple[Samples, Grid]:
    """``Samples`` and ``Grid`` for ``lengths`` (checked) on ``shape`` (ranks, micro-batches, capacity).

    With one capacity (no ``costs``, no ``patch_capacity``) the costs are ``cost_model``'s and the patches
    empty. Otherwise every phase plans with two: the patches given (or none), and ``patch_capacity``, or
    where that is 0 (no limit) one no micro-batch can reach, so only the order by cost differs.
    ``encoder_costs`` (only with ``costs``) is the vision encoder's part of them, evened out too."""
    ranks, micro_batches, capacity = shape
    checked, limit = check_patches(patches, lengths.size, patch_capacity)
    if encoder_costs is not None and costs is None:
        msg = "encoder_costs is the encoder's part of costs: give costs too"
        raise ValueError(msg)
    if costs is None and limit == 0:
        grid = Grid(ranks, micro_batches, capacity, int(micro_bits(micro_batches)), 0)
        return Samples(lengths, cost_model.costs(lengths), _NO_PATCHES, _NO_COSTS), grid
    the_costs = cost_model.costs(lengths) if costs is None else check_costs(costs, lengths.size)
    the_patches = np.zeros(lengths.size, np.int64) if checked is None else checked
    encoder = _NO_COSTS if encoder_costs is None else check_costs(encoder_costs, lengths.size, "encoder_costs")
    grid = Grid(ranks, micro_batches, capacity, int(micro_bits(micro_batches)), patch_limit(the_patches, limit))
    return Samples(lengths, the_costs, the_patches, encoder), grid


def patch_limit(patches: np.ndarray, patch_capacity: int) -> int:
    """The patches a micro-batch holds at most as the kernels read it: ``patch_capacity``, or where that is 0 (no
    limit) one no micro-batch can reach."""
    return int(patch_capacity) or max(1, int(patches.sum()))
