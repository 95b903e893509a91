"""One context-parallel step's samples planned again over another shape, none dropped or repeated. Pure: no Kafka.

**The shape.** A context-parallel job's step spans every rank of the data x context mesh. Over ``R`` ranks its
blocks are the spec's (``step.context_parallel``) where they fit: static blocks keep their size, which must divide
``R``; an aligned mode's largest block is at most the largest power of two within ``R`` ranks, a free mode's at
most ``R``. A rank holds as many tokens as before; the micro-batches a rank (by default enough that the step
holds at least the original's tokens in all) and the most a rank may run keep the spec's ratio.

**The plan.** The step's samples are put back together from their slices (``cp_samples``) and planned by the
constructor's own function for a context-parallel step, ``plan_cp_step``, over the new shape and under the spec's
``cost.context_parallel`` terms, as its candidates in the order their blocks' first ranks hold them. What that
plan defers (past its balance, or past the step's tokens counted at each sample's least block) a replay must
place all the same: the longest first, each on the least size of its own that fits (a doubling only where that
does not), on the block of the mode whose ranks end soonest, in the fullest micro-batch whose slots on the
block's ranks are free or the same block's and have room for its slice, within the step's tokens. Should some
find no room, the original block micro-batches are kept whole instead: each on a free block of its size, in a
micro-batch of its own, the widest first. That fits whenever the new shape has at least the original's slots
in all and its blocks: static blocks, or aligned ones over a power of two of ranks, never leave a gap a block
cannot use. The step is then cut into each rank's slices (``build_cp_batches``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from pipeline.planning.scheduler.context_parallel import (
    block_sizes,
    cp_sizes,
    padded,
    plan_cp_step,
    slice_tokens,
    validate_cp_plan,
)
from pipeline.planning.scheduler.cp_plan import CPMode, CPPlan, CPShape
from pipeline.planning.step.assemble_cp import build_cp_batches
from pipeline.spec.cp_cost import ContextParallelCost
from pipeline.tools.replay.cp_samples import StepSamples, read_step
from pipeline.tools.replay.reshape import ReshapeError, default_micro_batches
from topics.errors import MixflowError
from topics.formats.cp_batch import CPBatch
from topics.formats.cp_slices import padded_length
from topics.formats.sample import Sample


def replay_cp_shape(
    spec: CPShape, original_ranks: int, capacity: int, ranks: int, micro_batches: int | None
) -> CPShape:
    """The context-parallel shape of a replay over ``ranks`` ranks of ``capacity`` tokens (the module docstring):
    the spec's ``spec`` shape fitted to them, ``micro_batches`` a rank (None: enough that the step holds the
    original's ``original_ranks`` ranks' tokens). Raises ``MixflowError`` where the mode cannot use ``ranks``."""
    size = spec.size
    if spec.mode is CPMode.STATIC and ranks % size:
        msg = (
            f"--ranks {ranks} is not a multiple of {size}: the job's static context parallelism runs every sample "
            f"on a block of {size} ranks"
        )
        raise MixflowError(msg)
    if spec.mode is CPMode.ALIGNED:
        size = min(size, 1 << (ranks.bit_length() - 1))
    elif spec.mode is CPMode.FREE:
        size = min(size, ranks)
    micro = micro_batches or default_micro_batches(original_ranks, spec.micro_batches, ranks)
    most = -(-spec.max_micro_batches * micro // spec.micro_batches)
    return replace(spec, ranks=ranks, micro_batches=micro, capacity=capacity, size=size, max_micro_batches=most)


def reshape_cp_step(batches: Sequence[CPBatch], shape: CPShape, cost: ContextParallelCost) -> list[CPBatch]:
    """The samples of one context-parallel step's ``batches`` (one per original rank) in one batch per rank of
    ``shape``, planned under ``cost``. Raises ``ReshapeError`` naming the step when they do not all fit."""
    step = batches[0].step
    found = read_step(batches)
    return build_cp_batches(step, replan_cp_step(step, found, shape, cost), found.samples)


def replan_cp_step(step: int, found: StepSamples, shape: CPShape, cost: ContextParallelCost) -> CPPlan:
    """``plan_cp_step`` of ``found``'s samples (a step's, as candidates in their order) over ``shape``, and what
    it deferred placed after it, or else the original block micro-batches kept whole (the module docstring).
    Raises ``ReshapeError`` when some do not fit."""
    samples = found.samples
    lengths = np.fromiter((s.length for s in samples), np.int64, len(samples))
    plan = plan_cp_step(lengths, shape, cost)
    if not plan.placed_mask.all():
        plan = _place_the_rest(plan, lengths, cost)
    if not plan.placed_mask.all():
        whole = _whole_block_micro_batches(found, lengths, shape, cost)
        plan = whole if whole.placed_mask.all() else plan
    if not plan.placed_mask.all():
        raise ReshapeError(_does_not_fit(step, samples, lengths, plan, cp_sizes(lengths, shape, cost)))
    validate_cp_plan(plan, lengths)
    return plan


def _place_the_rest(plan: CPPlan, lengths: np.ndarray, cost: ContextParallelCost) -> CPPlan:
    """``plan`` with its deferred samples placed where they fit (the module docstring); those that fit nowhere
    stay deferred."""
    shape = plan.shape
    rank, cp, micro = plan.rank.copy(), plan.cp.copy(), plan.micro.copy()
    tokens = np.zeros((shape.ranks, shape.max_micro_batches), np.int64)  # slice tokens of every slot
    owner = np.full(tokens.shape, -1, np.int64)  # the block holding a slot: first * (ranks + 1) + size
    sample, place = plan.slots()
    at = (rank[sample] + place, micro[sample])
    np.add.at(tokens, at, slice_tokens(lengths[sample], cp[sample]))
    owner[at] = rank[sample] * (shape.ranks + 1) + cp[sample]
    busy = plan.rank_times(lengths, cost)
    placed = plan.placed_mask
    room = shape.ranks * shape.micro_batches * shape.capacity - int(padded(lengths[placed], cp[placed]).sum())
    least = cp_sizes(lengths, shape, cost)
    sizes = block_sizes(least, shape)
    deferred = np.flatnonzero(~placed)
    longest_first = deferred[np.lexsort((deferred, -padded(lengths[deferred], np.maximum(least[deferred], 1))))]
    for i in longest_first.tolist():
        best: tuple[float, int, int, int] | None = None
        for c in sizes[i][sizes[i] > 0].tolist():
            if padded_length(int(lengths[i]), c) > room:
                continue
            own = padded_length(int(lengths[i]), c) // c
            for first in range(0, shape.ranks - c + 1, 1 if shape.mode is CPMode.FREE else c):
                block = first * (shape.ranks + 1) + c
                held = owner[first : first + c]
                fits = ((held == -1) | (held == block)).all(axis=0) & (
                    tokens[first : first + c] + own <= shape.capacity
                ).all(axis=0)
                if not fits.any():
                    continue
                fill = np.where(fits, tokens[first : first + c].max(axis=0), -1)
                m = int(fill.argmax())  # the fullest with room: the emptier ones stay for longer slices
                end = float(busy[first : first + c].max() + _seconds(cost, int(lengths[i]), first, c))
                if best is None or (end, c, first, m) < best:
                    best = (end, c, first, m)
            if best is not None:
                break  # the least size that fits: the least padding, the fewest slots
        if best is None:
            continue
        _, c, first, m = best
        rank[i], cp[i], micro[i] = first, c, m
        tokens[first : first + c, m] += padded_length(int(lengths[i]), c) // c
        owner[first : first + c, m] = first * (shape.ranks + 1) + c
        busy[first : first + c] += _seconds(cost, int(lengths[i]), first, c)
        room -= padded_length(int(lengths[i]), c)
    return CPPlan(rank, cp, micro, shape)


def _whole_block_micro_batches(
    found: StepSamples, lengths: np.ndarray, shape: CPShape, cost: ContextParallelCost
) -> CPPlan:
    """Each micro-batch of each original block (its samples together) on a block of the same size of ``shape``,
    in a micro-batch of its own there: the widest first, then the costliest, each on the free block of the mode
    whose ranks end soonest. All deferred where one cannot go (a size the shape has not, no free block left, or
    more padded tokens than the step holds)."""
    n = lengths.size
    rank, cp, micro = np.full(n, -1, np.int32), np.zeros(n, np.int32), np.full(n, -1, np.int32)
    deferred = CPPlan(rank.copy(), cp.copy(), micro.copy(), shape)
    where = np.stack([found.first, found.size, found.micro], axis=1)
    keys, group = np.unique(where, axis=0, return_inverse=True)
    group = group.reshape(-1)
    sizes = keys[:, 1]
    step_tokens = shape.ranks * shape.micro_batches * shape.capacity
    if not np.isin(sizes, shape.sizes()).all() or int(padded(lengths, found.size).sum()) > step_tokens:
        return deferred
    costs = {
        within: np.bincount(group, weights=cost.per_rank(lengths, found.size, within), minlength=len(keys))
        for within in (True, False)
    }
    used = np.zeros((shape.ranks, shape.max_micro_batches), bool)
    busy = np.zeros(shape.ranks)
    for g in np.lexsort((np.arange(len(keys)), -costs[True], -sizes)).tolist():
        c = int(sizes[g])
        best: tuple[float, int, int] | None = None
        for first in range(0, shape.ranks - c + 1, 1 if shape.mode is CPMode.FREE else c):
            free = np.flatnonzero(~used[first : first + c].any(axis=0))
            if free.size:
                seconds = costs[bool(cost.within_node(first, c))][g]
                option = (float(busy[first : first + c].max() + seconds), int(free[0]), first)
                best = option if best is None or option < best else best
        if best is None:
            return deferred
        end, m, first = best
        members = group == g
        rank[members], cp[members], micro[members] = first, c, m
        used[first : first + c, m] = True
        busy[first : first + c] = end
    return CPPlan(rank, cp, micro, shape)


def _seconds(cost: ContextParallelCost, length: int, first: int, c: int) -> float:
    """What a sample of ``length`` tokens on the block of ``c`` ranks from ``first`` costs each of them."""
    return float(cost.per_rank(np.array([length]), c, cost.within_node(first, c))[0])


def _does_not_fit(step: int, samples: Sequence[Sample], lengths: np.ndarray, plan: CPPlan, least: np.ndarray) -> str:
    shape = plan.shape
    where = f"{shape.mode.value} context parallelism over {shape.ranks} ranks"
    unheld = np.flatnonzero(~plan.placed_mask & (least == 0))
    if unheld.size:
        i = int(unheld[0])
        return (
            f"step {step}: sample {samples[i].sample_id} of {int(lengths[i])} tokens fits no block of {where} "
            f"(blocks of at most {shape.size} ranks of {shape.capacity} tokens)"
        )
    return (
        f"step {step}: its {lengths.size} samples ({int(lengths.sum())} tokens, the longest {int(lengths.max())}) do "
        f"not all fit in {where} x {shape.micro_batches} micro-batches of {shape.capacity} tokens (at most "
        f"{shape.max_micro_batches} a rank); give a larger --micro-batches"
    )
