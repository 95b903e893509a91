"""One step's samples planned again over another step shape, none dropped or repeated. Pure: no Kafka.

The balancing scheduler places what it can within its balance tolerance and defers the rest; a replay
must place everything. What it deferred goes into the room left, longest first, each on the least
costly rank with room. Should that fail, the original micro-batches are kept whole and dealt over the
new ranks, costliest first, each to the least costly rank with a free micro-batch: that always fits
when the new shape has at least as many micro-batches in all as the original had.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipeline.planning.scheduler import CostModel, StepPlan, plan_step
from pipeline.planning.step.assemble import BatchFormat, build_batches
from topics.batch import Batch
from topics.errors import MixflowError


class ReshapeError(MixflowError):
    """A step's samples do not all fit in the shape asked for."""


def default_micro_batches(ranks: int, micro_batches: int, new_ranks: int) -> int:
    """Micro-batches per rank that give ``new_ranks`` ranks at least the micro-batches in all that ``ranks``
    ranks of ``micro_batches`` had, so that every step fits."""
    return -(-ranks * micro_batches // new_ranks)


def reshape_step(batches: Sequence[Batch], ranks: int, micro_batches: int, cost_model: CostModel) -> list[Batch]:
    """The samples of one step's batches (one per original rank) in ``ranks`` new batches of
    ``micro_batches`` micro-batches of the same capacity. Raises ``ReshapeError`` when they do not fit."""
    step, capacity = batches[0].step, batches[0].capacity
    samples = [sample for batch in batches for sample in batch.samples()]
    lengths = np.fromiter((s.length for s in samples), dtype=np.int64, count=len(samples))
    # The original micro-batch of each sample, numbered across the ranks.
    groups = np.concatenate(
        [np.zeros(0, np.int64)] + [b.micro_batch.astype(np.int64) + i * b.micro_batches for i, b in enumerate(batches)]
    )
    plan = plan_step(lengths, ranks, micro_batches, capacity, cost_model)
    if not plan.placed_mask.all():
        plan = _place_the_rest(plan, lengths, cost_model)
    if not plan.placed_mask.all() and ranks * micro_batches >= sum(b.micro_batches for b in batches):
        plan = _whole_micro_batches(groups, lengths, ranks, micro_batches, capacity, cost_model)
    if not plan.placed_mask.all():
        least = default_micro_batches(len(batches), batches[0].micro_batches, ranks)
        msg = (
            f"step {step}: its {lengths.size} samples ({int(lengths.sum())} tokens, the longest {int(lengths.max())}) "
            f"do not all fit in {ranks} ranks x {micro_batches} micro-batches of {capacity} tokens; give a larger "
            f"--micro-batches ({least} always fits)"
        )
        raise ReshapeError(msg)
    first = batches[0]
    return build_batches(step, plan, samples, lengths, BatchFormat(first.with_media, first.patches_per_micro_batch))


def _place_the_rest(plan: StepPlan, lengths: np.ndarray, cost_model: CostModel) -> StepPlan:
    """``plan`` with its deferred samples placed where there is room, longest first, each on the least
    costly rank with room and there in the emptiest micro-batch with room; those that find none stay
    deferred."""
    rank, micro = plan.rank.copy(), plan.micro.copy()
    costs = cost_model.costs(lengths)
    placed = rank >= 0
    tokens = np.zeros((plan.ranks, plan.micro_batches), dtype=np.int64)
    np.add.at(tokens, (rank[placed], micro[placed]), lengths[placed])
    rank_costs = np.bincount(rank[placed], weights=costs[placed], minlength=plan.ranks)
    for i in sorted(np.flatnonzero(~placed).tolist(), key=lambda i: (-int(lengths[i]), i)):
        room = plan.capacity - tokens >= lengths[i]
        open_ranks = np.flatnonzero(room.any(axis=1))
        if open_ranks.size == 0:
            continue
        r = int(open_ranks[np.argmin(rank_costs[open_ranks])])
        open_micro = np.flatnonzero(room[r])
        m = int(open_micro[np.argmin(tokens[r, open_micro])])
        rank[i], micro[i] = r, m
        tokens[r, m] += lengths[i]
        rank_costs[r] += costs[i]
    return StepPlan(rank, micro, plan.ranks, plan.micro_batches, plan.capacity)


def _whole_micro_batches(
    groups: np.ndarray, lengths: np.ndarray, ranks: int, micro_batches: int, capacity: int, cost_model: CostModel
) -> StepPlan:
    """Each original micro-batch (``groups``: the one of each sample) into one new micro-batch: costliest
    first, each to the least costly rank with a free micro-batch. Needs ``ranks * micro_batches`` at
    least the number of groups."""
    count = int(groups.max()) + 1 if groups.size else 0
    group_costs = np.bincount(groups, weights=cost_model.costs(lengths), minlength=count)
    rank_costs = np.zeros(ranks)
    used = np.zeros(ranks, dtype=np.int64)
    group_rank = np.zeros(count, dtype=np.int32)
    group_micro = np.zeros(count, dtype=np.int32)
    for g in sorted(range(count), key=lambda g: (-float(group_costs[g]), g)):
        free = np.flatnonzero(used < micro_batches)
        r = int(free[np.argmin(rank_costs[free])])
        group_rank[g], group_micro[g] = r, used[r]
        used[r] += 1
        rank_costs[r] += group_costs[g]
    return StepPlan(group_rank[groups], group_micro[groups], ranks, micro_batches, capacity)
