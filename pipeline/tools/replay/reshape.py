"""One step's samples planned again over another step shape, none dropped or repeated. Pure: no Kafka.

The balancing scheduler places what it can within its balance tolerance and defers the rest; a replay
must place everything. What it deferred goes into the room left, largest first, each on the least
costly rank with room. Should that fail, the original micro-batches are kept whole and dealt over the
new ranks, costliest first, each to the least costly rank with a free micro-batch: that always fits
when the new shape has at least as many micro-batches in all as the original had.

**The plan.** A step's samples, in the order the original's batches hold them, are planned by the very
function the constructor plans its steps with (``plan_with_media``), over the new shape and with no packing
to start from. Where they carry vision patches under the batches' patch budget, or cost something in the
vision encoder (the spec's ``cost.vision``), that is the multimodal plan: each sample costs its LLM cost
plus its encoder cost, no micro-batch holds more tokens or more patches than the original's, and the
encoder's part is evened out over the ranks. A step of text alone is planned on its tokens and LLM cost
only. What is placed into the room left must fit both capacities, "largest" being the larger share of a
micro-batch's tokens or patches; a whole original micro-batch keeps both by itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.planning.scheduler import CostModel, StepPlan
from pipeline.planning.scheduler.media import plan_with_media, planned_with_media
from pipeline.planning.shape import StepShape
from pipeline.planning.step.assemble import BatchFormat, build_batches
from pipeline.planning.step.pool import encoder_cost
from pipeline.spec.cost import VisionCostModel
from topics.errors import MixflowError
from topics.formats.batch import Batch
from topics.formats.sample import Sample


class ReshapeError(MixflowError):
    """A step's samples do not all fit in the shape asked for."""


@dataclass(frozen=True, eq=False)
class StepLoad:
    """What each sample of a step weighs: ``lengths`` and ``patches`` (int64, its tokens and vision patches)
    and ``encoder_costs`` (float64, its cost in the vision encoder), as the constructor's plan takes them;
    and, for what the plan leaves to the room left, ``costs`` (float64; the LLM's, plus the encoder's in a
    multimodal step) and ``patch_capacity``, the patches a micro-batch holds at most (0: no limit, or a
    step of text)."""

    lengths: np.ndarray
    patches: np.ndarray
    encoder_costs: np.ndarray
    costs: np.ndarray
    patch_capacity: int


def step_load(
    samples: Sequence[Sample], patch_capacity: int, cost_model: CostModel, vision: VisionCostModel | None = None
) -> StepLoad:
    """The ``StepLoad`` of ``samples`` under the patch budget ``patch_capacity`` (0: none), multimodal where
    the constructor's plan is (``planned_with_media``)."""
    lengths = np.fromiter((s.length for s in samples), np.int64, len(samples))
    patches = np.fromiter((s.patches for s in samples), np.int64, len(samples))
    encoder = np.fromiter((encoder_cost(s, vision) for s in samples), np.float64, len(samples))
    llm = cost_model.costs(lengths)
    if not planned_with_media(patches, encoder, patch_capacity):
        return StepLoad(lengths, patches, encoder, llm, 0)
    return StepLoad(lengths, patches, encoder, llm + encoder, patch_capacity)


def plan_load(load: StepLoad, shape: StepShape, cost_model: CostModel) -> StepPlan:
    """The constructor's plan of ``load``'s samples as a step's candidates, in their order, over ``shape``
    with no packing to start from (``plan_with_media``, the encoder's part evened out)."""
    return plan_with_media(load.lengths, shape, cost_model, None, load.patches, load.encoder_costs)


def default_micro_batches(ranks: int, micro_batches: int, new_ranks: int) -> int:
    """Micro-batches per rank that give ``new_ranks`` ranks at least the micro-batches in all that ``ranks``
    ranks of ``micro_batches`` had, so that every step fits."""
    return -(-ranks * micro_batches // new_ranks)


def reshape_step(
    batches: Sequence[Batch],
    ranks: int,
    micro_batches: int,
    cost_model: CostModel,
    vision: VisionCostModel | None = None,
) -> list[Batch]:
    """The samples of one step's batches (one per original rank) in ``ranks`` new batches of
    ``micro_batches`` micro-batches of the same capacity and the same patch budget, with their media.
    ``vision``: the encoder's cost model (the spec's ``cost.vision``; None: the LLM's cost alone). Raises
    ``ReshapeError`` when they do not fit."""
    first = batches[0]
    step, capacity = first.step, first.capacity
    samples = [sample for batch in batches for sample in batch.samples()]
    # The original micro-batch of each sample, numbered across the ranks.
    groups = np.concatenate(
        [np.zeros(0, np.int64)] + [b.micro_batch.astype(np.int64) + i * b.micro_batches for i, b in enumerate(batches)]
    )
    budget = first.patches_per_micro_batch or 0
    load = step_load(samples, budget, cost_model, vision)
    lengths = load.lengths
    plan = plan_load(load, StepShape(ranks, micro_batches, capacity, budget), cost_model)
    if not plan.placed_mask.all():
        plan = _place_the_rest(plan, lengths, load)
    if not plan.placed_mask.all() and ranks * micro_batches >= sum(b.micro_batches for b in batches):
        plan = _whole_micro_batches(groups, ranks, micro_batches, capacity, load)
    if not plan.placed_mask.all():
        least = default_micro_batches(len(batches), first.micro_batches, ranks)
        raise ReshapeError(_does_not_fit(step, lengths, load, plan, least))
    return build_batches(step, plan, samples, lengths, BatchFormat(first.with_media, first.patches_per_micro_batch))


def _does_not_fit(step: int, lengths: np.ndarray, load: StepLoad, plan: StepPlan, least: int) -> str:
    what = f"{int(lengths.sum())} tokens, the longest {int(lengths.max())}"
    room = f"{plan.capacity} tokens"
    if load.patch_capacity:
        what += f"; {int(load.patches.sum())} patches, the most in one {int(load.patches.max())}"
        room += f" and {load.patch_capacity} patches"
    return (
        f"step {step}: its {lengths.size} samples ({what}) do not all fit in {plan.ranks} ranks x "
        f"{plan.micro_batches} micro-batches of {room}; give a larger --micro-batches ({least} always fits)"
    )


def _place_the_rest(plan: StepPlan, lengths: np.ndarray, load: StepLoad) -> StepPlan:
    """``plan`` with its deferred samples placed where there is room (tokens, and patches under a budget),
    largest first, each on the least costly rank with room and there in the emptiest micro-batch with room;
    those that find none stay deferred. Without a patch budget, largest and emptiest are by tokens alone."""
    rank, micro = plan.rank.copy(), plan.micro.copy()
    placed = rank >= 0
    shape = (plan.ranks, plan.micro_batches)
    tokens, held = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
    np.add.at(tokens, (rank[placed], micro[placed]), lengths[placed])
    np.add.at(held, (rank[placed], micro[placed]), load.patches[placed])
    rank_costs = np.bincount(rank[placed], weights=load.costs[placed], minlength=plan.ranks)
    budget = load.patch_capacity
    size = lengths / plan.capacity if not budget else np.maximum(lengths / plan.capacity, load.patches / budget)
    for i in sorted(np.flatnonzero(~placed).tolist(), key=lambda i: (-float(size[i]), i)):
        room = plan.capacity - tokens >= lengths[i]
        if budget:
            room &= budget - held >= load.patches[i]
        open_ranks = np.flatnonzero(room.any(axis=1))
        if open_ranks.size == 0:
            continue
        r = int(open_ranks[np.argmin(rank_costs[open_ranks])])
        open_micro = np.flatnonzero(room[r])
        fill = tokens[r] if not budget else np.maximum(tokens[r] / plan.capacity, held[r] / budget)
        m = int(open_micro[np.argmin(fill[open_micro])])
        rank[i], micro[i] = r, m
        tokens[r, m] += lengths[i]
        held[r, m] += load.patches[i]
        rank_costs[r] += load.costs[i]
    return StepPlan(rank, micro, plan.ranks, plan.micro_batches, plan.capacity, plan.patch_capacity)


def _whole_micro_batches(groups: np.ndarray, ranks: int, micro_batches: int, capacity: int, load: StepLoad) -> StepPlan:
    """Each original micro-batch (``groups``: the one of each sample) into one new micro-batch: costliest
    first, each to the least costly rank with a free micro-batch. Needs ``ranks * micro_batches`` at
    least the number of groups. Each keeps within both capacities, which are the original's."""
    count = int(groups.max()) + 1 if groups.size else 0
    group_costs = np.bincount(groups, weights=load.costs, minlength=count)
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
    return StepPlan(group_rank[groups], group_micro[groups], ranks, micro_batches, capacity, load.patch_capacity)
