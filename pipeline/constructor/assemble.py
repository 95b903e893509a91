"""Turn one step's candidates into one batch per rank: plan with the scheduler, pack, encode. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.constructor.pool import Candidate
from pipeline.scheduler import CostModel, StepPlan, plan_step, rank_order
from pipeline.spec import StepSpec
from topics.batch import Batch


@dataclass(frozen=True)
class AssembledStep:
    step: int
    batches: list[Batch]
    delivered: list[Candidate]
    deferred: list[Candidate]
    plan: StepPlan
    lengths: np.ndarray

    @property
    def tokens(self) -> int:
        return int(self.lengths[self.plan.placed_mask].sum())


def assemble_step(step: int, candidates: Sequence[Candidate], shape: StepSpec, cost_model: CostModel) -> AssembledStep:
    """Plan ``candidates`` (priority order, oldest first) over the step's ranks and micro-batches and
    build each rank's batch, micro-batch by micro-batch. Unplaced candidates come back as deferred."""
    lengths = np.fromiter((c.sample.length for c in candidates), dtype=np.int64, count=len(candidates))
    ranks, micro_batches, capacity = shape.ranks, shape.micro_batches, shape.tokens_per_micro_batch
    plan = plan_step(lengths, ranks, micro_batches, capacity, cost_model)
    batches = []
    for rank in range(ranks):
        indices, micro_batch = rank_order(plan, rank)
        chosen = [candidates[i] for i in indices.tolist()]
        offsets = np.zeros(len(chosen) + 1, dtype=np.int64)
        np.cumsum(lengths[indices], out=offsets[1:])
        tokens = np.concatenate([np.zeros(0, np.int32), *(c.sample.tokens for c in chosen)]).astype(np.int32)
        batches.append(
            Batch.from_arrays(
                step=step,
                rank=rank,
                ranks=ranks,
                micro_batches=micro_batches,
                capacity=capacity,
                sample_ids=[c.sample.sample_id for c in chosen],
                sources=[c.sample.source for c in chosen],
                micro_batch=micro_batch,
                offsets=offsets,
                tokens=tokens,
            )
        )
    placed = plan.placed_mask
    delivered = [c for c, p in zip(candidates, placed.tolist(), strict=True) if p]
    deferred = [c for c, p in zip(candidates, placed.tolist(), strict=True) if not p]
    return AssembledStep(step, batches, delivered, deferred, plan, lengths)
