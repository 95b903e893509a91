"""``plan_cp_step``: a step whose long samples span blocks of ranks (context parallelism), decided per sample.

The step is ``ranks`` ranks of ``micro_batches`` micro-batches, each holding at most ``capacity`` tokens on a
rank (its memory). A sample of ``L`` tokens on a block of ``c`` ranks is padded to a multiple of ``2c`` and
each rank holds two of its ``2c`` chunks (zigzag: ``topics.formats.cp_slices``), ``L_pad / c`` tokens. The
mode says which blocks there are:

- ``static``: one size ``size`` for every sample, blocks at multiples of it (a fixed CP group per data-parallel
  rank, as most trainers run);
- ``aligned``: a power-of-two ``c`` per sample and a block aligned to ``c`` (Megatron-Core's hybrid context
  parallelism, ``parallel_state.create_hybrid_dp_cp_groups``);
- ``free``: any ``c`` up to ``size`` and any block of consecutive ranks (ByteScale's hybrid data parallelism).

Each sample's least size is the cheapest its slice fits (the least GPU time, ``ContextParallelCost.gpu_time``;
the smallest among equals). The samples split over more than one rank are placed first, on block micro-batches
(``_kernels/blocks.py``), each on its least size (or a doubling of it, where that ends sooner; ``plan_cp_step``); the
others are planned by ``plan_step`` around them, with the block micro-batches' slots full and their ranks'
costs as they are.
Guarantee against starvation: no deferred sample has a newer placed one that it could replace (among the
samples not split, one at least as long; among the others, one at least as long on a block at least its least
size); and the split samples never take the room the older samples not split need (their tokens, and a tenth
more for packing).
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.planning.scheduler._kernels.blocks import place_blocks
from pipeline.planning.scheduler._kernels.state import Placement
from pipeline.planning.scheduler.cp_plan import CPMode, CPPlan, CPShape
from pipeline.planning.scheduler.plan import plan_step_on
from pipeline.planning.scheduler.validation import check_capacity
from pipeline.spec.cost import CostModel
from pipeline.spec.cp_cost import TRAINING_FACTOR, ContextParallelCost
from pipeline.spec.sections import StepSpec

RESERVE_SLACK = 1.1
"""Room kept for the older samples not split, over their tokens: LPT leaves a little of every micro-batch."""


def cp_shape_of(step: StepSpec) -> CPShape | None:
    """The context-parallel shape of a spec's step (None without ``step.context_parallel``)."""
    cp = step.context_parallel
    if cp is None:
        return None
    extra = cp.max_micro_batches or 0
    return CPShape(step.ranks, step.micro_batches, step.tokens_per_micro_batch, CPMode(cp.mode), cp.size, extra)


def padded(lengths: np.ndarray, cp: np.ndarray) -> np.ndarray:
    """Each sample's tokens once padded for its block: to a multiple of ``2 * cp`` (unpadded where ``cp == 1``)."""
    length, c = np.asarray(lengths, np.int64), np.asarray(cp, np.int64)
    unit = np.where(c > 1, 2 * c, 1)
    return -(-length // unit) * unit


def slice_tokens(lengths: np.ndarray, cp: np.ndarray) -> np.ndarray:
    """The tokens each rank of a sample's block holds: ``padded / cp``."""
    return padded(lengths, cp) // np.asarray(cp, np.int64)


def cp_sizes(lengths: np.ndarray, shape: CPShape, cost: ContextParallelCost) -> np.ndarray:
    """Each sample's least block size (int64; 0 where no block of the mode can hold it): the cheapest in GPU time
    of those its slice fits, the smallest among equals. The planner may give it a larger one (``block_sizes``).

    A sample's GPU time never falls as its block grows while the block stays within a node, nor while it spans
    nodes (the compute is the same; the exposed ring traffic, ``(c - 1) * max(0, a*L - b*L**2/c)``, and ``c``
    times ``gamma`` grow): the cheapest is the smallest size that fits, or the smallest that fits beyond a node
    where that is cheaper (a network faster than NVLink). Times within a millionth of each other are equal."""
    length = np.asarray(lengths, np.int64)
    sizes = np.asarray(shape.sizes(), np.int64)
    least = _smallest_fitting(length, sizes, shape.capacity, 1)
    beyond = _smallest_fitting(length, sizes, shape.capacity, cost.ranks_per_node + 1)
    other = (beyond > 0) & (beyond != least)
    if other.any():
        one = cost.gpu_time(length[other], least[other], least[other] <= cost.ranks_per_node)
        two = cost.gpu_time(length[other], beyond[other], False)
        cheaper = two < one * (1 - 1e-6)
        least[np.flatnonzero(other)[cheaper]] = beyond[other][cheaper]
    return least


def _smallest_fitting(lengths: np.ndarray, sizes: np.ndarray, capacity: int, at_least: int) -> np.ndarray:
    """The smallest of ``sizes`` (ascending) from ``at_least`` on whose slices of each sample fit ``capacity``
    (0: none). One rank holds the sample whole; past one, a slice is ``2 * ceil(L / 2c)`` tokens, which fits from
    ``c = ceil(L / 2h)`` on (``h = capacity // 2``)."""
    half = capacity // 2
    split = np.maximum(-(-lengths // (2 * half)), max(2, at_least)) if half else np.full(lengths.size, sizes[-1] + 1)
    index = np.searchsorted(sizes, split)
    least = np.where(index < sizes.size, sizes[np.minimum(index, sizes.size - 1)], 0)
    if at_least <= 1 and sizes[0] == 1:
        least[lengths <= capacity] = 1
    return least


def block_sizes(least: np.ndarray, shape: CPShape) -> np.ndarray:
    """The sizes each sample may have, smallest first, 0 past the last (int64, one row a sample): its least size
    and every doubling of it up to ``shape.size`` (static: the one size)."""
    least = np.asarray(least, np.int64)
    doublings = max(1, int(shape.size).bit_length())
    sizes = np.zeros((least.size, doublings), np.int64)
    for k in range(doublings):
        c = least << k
        sizes[:, k] = np.where((c <= shape.size) & (least > 0), c, 0)
    if shape.mode is CPMode.STATIC:
        sizes[:, 1:] = 0
    return sizes


def lower_bound(lengths: np.ndarray, shape: CPShape, cost: ContextParallelCost) -> float:
    """No plan of these samples takes less time a step: every sample at its cheapest size, GPU time spread evenly
    over the ranks, and no less than the sample slowest even on the block where it ends soonest (samples no block
    holds are left out). That block is searched only for the samples that take longer than the even spread on
    their least size: the others cannot raise the bound."""
    length = np.asarray(lengths, np.int64)
    least = cp_sizes(length, shape, cost)
    placeable = least > 0
    if not placeable.any():
        return 0.0
    length, least = length[placeable], least[placeable]
    within = least <= cost.ranks_per_node
    spread = float(cost.gpu_time(length, least, within).sum()) / shape.ranks
    candidates = length[cost.per_rank(length, least, within) > spread]
    sizes = np.asarray(shape.sizes(), np.int64)
    rows = max(1, (1 << 20) // sizes.size)  # samples priced on every size at once
    slowest = 0.0
    for start in range(0, candidates.size, rows):
        chunk = candidates[start : start + rows, None]
        fits = slice_tokens(chunk, sizes[None, :]) <= shape.capacity
        time = cost.per_rank(np.broadcast_to(chunk, fits.shape), sizes, sizes <= cost.ranks_per_node)
        slowest = max(slowest, float(np.where(fits, time, np.inf).min(axis=1).max()))
    return max(spread, slowest)


def plan_cp_step(
    lengths: np.ndarray,
    shape: CPShape,
    cost: ContextParallelCost | None = None,
    *,
    tolerance: float = 0.001,
) -> CPPlan:
    """Plan one step of ``lengths`` (candidates in priority order, index 0 the oldest; see the module docstring).
    Only the longest prefix whose padded tokens fit the step is considered; the rest is deferred.

    The blocks of a looser mode include a stricter mode's (aligned blocks are free blocks, and static ones are
    aligned): plans under the stricter modes are made too, each with samples on their least sizes only and with
    wider blocks where a sample would end past the step's lower bound, and the one that moves the most tokens a
    second of step time is kept (``tokens_per_second``; ties: the first made), so that a looser mode never does
    worse."""
    cost = cost or ContextParallelCost()
    length = np.asarray(lengths)
    if length.ndim != 1 or (length.size and (not np.issubdtype(length.dtype, np.integer) or length.min() < 1)):
        msg = "lengths must be a 1-D array of integers >= 1"
        raise ValueError(msg)
    length = length.astype(np.int64)
    best = _plan(length, shape, cost, tolerance, widen=False)
    best_rate = best.tokens_per_second(length, cost)
    # Static blocks have one size: wider blocks are none, and widening makes the same plan.
    variants = [(s, w) for s in (shape, *_stricter(length, shape)) for w in (False, s.mode is not CPMode.STATIC)]
    for kind, widen in list(dict.fromkeys(variants))[1:]:
        other = _plan(length, kind, cost, tolerance, widen)
        rate = other.tokens_per_second(length, cost)
        if rate > best_rate:
            best, best_rate = CPPlan(other.rank, other.cp, other.micro, shape), rate
    return best


def _stricter(lengths: np.ndarray, shape: CPShape) -> list[CPShape]:
    """The shapes of the stricter modes whose blocks ``shape``'s mode allows too."""
    if shape.mode is CPMode.STATIC:
        return []
    out = []
    if shape.mode is CPMode.FREE:
        size = 1 << (shape.size.bit_length() - 1)
        out.append(
            CPShape(shape.ranks, shape.micro_batches, shape.capacity, CPMode.ALIGNED, size, shape.max_micro_batches)
        )
    size = _static_size(lengths, shape.ranks, shape.capacity)
    if size <= shape.size and shape.ranks % size == 0:
        static = CPShape(shape.ranks, shape.micro_batches, shape.capacity, CPMode.STATIC, size)
        out.append(
            CPShape(
                shape.ranks, shape.micro_batches, shape.capacity, CPMode.STATIC, static.size, shape.max_micro_batches
            )
        )
    return out


def _plan(length: np.ndarray, shape: CPShape, cost: ContextParallelCost, tolerance: float, widen: bool) -> CPPlan:
    n = length.size
    least = cp_sizes(length, shape, cost)
    tokens = np.where(least > 1, padded(length, np.maximum(least, 1)), length)
    step_tokens = shape.ranks * shape.micro_batches * shape.capacity
    limit = int(np.searchsorted(np.cumsum(tokens), step_tokens, side="right"))
    rank = np.full(n, -1, np.int32)
    micro = np.full(n, -1, np.int32)
    cp = np.zeros(n, np.int32)
    split = np.flatnonzero(least[:limit] > 1)
    whole = np.flatnonzero(least[:limit] == 1)
    sizes = block_sizes(least[split], shape)
    lengths = np.repeat(length[split, None], sizes.shape[1], axis=1)
    usable = sizes > 0
    c = np.maximum(sizes, 1)
    slices = np.where(usable, slice_tokens(lengths, c), 0)
    within = np.where(usable, cost.per_rank(lengths, c, True), 0.0)
    across = np.where(usable, cost.per_rank(lengths, c, False), 0.0)
    older_whole = np.searchsorted(whole, split)  # how many samples not split are older than each split one
    whole_tokens = np.concatenate([[0], np.cumsum(length[whole])])
    reserve = np.ceil(whole_tokens[older_whole] * RESERVE_SLACK).astype(np.int64)
    order = np.lexsort((split, -(sizes[:, 0] * within[:, 0])))  # costliest first, then oldest
    blocks = place_blocks(
        length[split],
        sizes,
        slices,
        within,
        across,
        reserve,
        order,
        (shape.ranks, shape.max_micro_batches, shape.capacity, cost.ranks_per_node, shape.mode is not CPMode.FREE),
        lower_bound(length[:limit], shape, cost) if widen else np.inf,
    )
    rank[split], micro[split], cp[split] = blocks.first, blocks.micro, blocks.cp
    if whole.size:
        taken = blocks.slot_first >= 0
        base = Placement(
            np.zeros(0, np.int64),
            blocks.rank_cost.copy(),
            np.where(taken, shape.capacity, blocks.tokens),
            np.zeros(taken.size),
            np.zeros(taken.size, np.int64),
        )
        seconds = CostModel(
            alpha=TRAINING_FACTOR * cost.model.alpha / cost.flops_per_s,
            beta=TRAINING_FACTOR * cost.model.beta / cost.flops_per_s,
            gamma=cost.gamma_s,
        )
        plan = plan_step_on(
            length[whole], shape.ranks, shape.max_micro_batches, shape.capacity, seconds, base, tolerance=tolerance
        )
        rank[whole], micro[whole] = plan.rank, plan.micro
        cp[whole] = np.where(plan.rank >= 0, 1, 0)
    return CPPlan(rank, cp, micro, shape)


def static_shape(lengths: np.ndarray, ranks: int, micro_batches: int, capacity: int) -> CPShape:
    """Static context parallelism sized for the longest sample, as trainers set it today: the smallest power of
    two whose slices of the longest sample fit ``capacity`` (``ValueError`` where ``ranks`` are not whole blocks
    of it)."""
    return CPShape(ranks, micro_batches, capacity, CPMode.STATIC, _static_size(lengths, ranks, capacity))


def _static_size(lengths: np.ndarray, ranks: int, capacity: int) -> int:
    longest = int(np.max(lengths)) if len(lengths) else 1
    size = 1
    while 2 * size <= ranks and math.ceil(longest / (2 * size)) * 2 > capacity:
        size *= 2
    return size


def validate_cp_plan(plan: CPPlan, lengths: np.ndarray) -> None:
    """Raise ValueError unless every sample is placed once (a block of the mode, every slot of it on the same
    micro-batch) or deferred (rank, cp and micro all -1 or 0), every slot holds samples of one block only, and no
    rank's micro-batch holds more than the capacity of slice tokens (each sample padded to ``2 * cp``)."""
    shape = plan.shape
    length = np.asarray(lengths, np.int64)
    n = length.size
    for name in ("rank", "cp", "micro"):
        array = getattr(plan, name)
        if not isinstance(array, np.ndarray) or array.dtype != np.int32 or array.shape != (n,):
            msg = f"plan.{name} must be an int32 array of shape ({n},)"
            raise ValueError(msg)
    placed = plan.rank >= 0
    if ((plan.micro >= 0) != placed).any() or ((plan.cp > 0) != placed).any():
        first = int(np.flatnonzero(((plan.micro >= 0) != placed) | ((plan.cp > 0) != placed))[0])
        msg = f"sample {first} is half placed: rank, cp and micro are all set, or all -1, -1 and 0"
        raise ValueError(msg)
    first, cp, micro = (a[placed].astype(np.int64) for a in (plan.rank, plan.cp, plan.micro))
    allowed = np.isin(cp, shape.sizes())
    aligned = (first % cp == 0) if shape.mode is not CPMode.FREE else np.ones(cp.size, bool)
    bad = ~allowed | ~aligned | (first + cp > shape.ranks) | (micro >= shape.max_micro_batches)
    if bad.any():
        i = int(np.flatnonzero(placed)[np.flatnonzero(bad)[0]])
        msg = (
            f"sample {i}: a block of {int(plan.cp[i])} ranks from rank {int(plan.rank[i])} at micro-batch "
            f"{int(plan.micro[i])} is not one of the {shape.mode.value} mode's (sizes {shape.sizes()}, "
            f"{shape.ranks} ranks, {shape.max_micro_batches} micro-batches)"
        )
        raise ValueError(msg)
    slots = shape.ranks * shape.max_micro_batches
    tokens = np.zeros(slots, np.int64)
    owner = np.full(slots, -1, np.int64)
    own = slice_tokens(length[placed], cp)
    indices = np.flatnonzero(placed)
    for k in range(indices.size):
        block = first[k] * (shape.ranks + 1) + cp[k]  # one number per (first rank, size)
        for r in range(first[k], first[k] + cp[k]):
            slot = r * shape.max_micro_batches + micro[k]
            if owner[slot] >= 0 and owner[slot] != block:
                msg = f"rank {r} micro-batch {micro[k]} holds samples of two blocks (sample {int(indices[k])})"
                raise ValueError(msg)
            owner[slot] = block
            tokens[slot] += own[k]
    check_capacity(tokens, shape.capacity, shape.max_micro_batches, "slice tokens", "capacity")
    step_tokens = int(padded(length[placed], cp).sum())
    if step_tokens > shape.ranks * shape.micro_batches * shape.capacity:
        msg = (
            f"the step holds {step_tokens} padded tokens, over its {shape.ranks * shape.micro_batches * shape.capacity}"
        )
        raise ValueError(msg)
