"""Turn one step's candidates into one batch per rank: plan with the scheduler, pack, encode. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.constructor.pool import Candidate
from pipeline.scheduler import CostModel, StepPlan, plan_step, rank_order
from pipeline.spec import StepSpec
from topics.batch import Batch
from topics.sample import Sample


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
    plan = plan_step(lengths, shape.ranks, shape.micro_batches, shape.tokens_per_micro_batch, cost_model)
    batches = build_batches(step, plan, [c.sample for c in candidates], lengths)
    placed = plan.placed_mask
    delivered = [c for c, p in zip(candidates, placed.tolist(), strict=True) if p]
    deferred = [c for c, p in zip(candidates, placed.tolist(), strict=True) if not p]
    return AssembledStep(step, batches, delivered, deferred, plan, lengths)


def build_batches(step: int, plan: StepPlan, samples: Sequence[Sample], lengths: np.ndarray) -> list[Batch]:
    """One batch per rank of ``plan`` (its shape and capacity) holding the ``samples`` it places there,
    micro-batch by micro-batch in ``rank_order``; ``lengths`` are the samples' token counts."""
    batches = []
    for rank in range(plan.ranks):
        indices, micro_batch = rank_order(plan, rank)
        chosen = [samples[i] for i in indices.tolist()]
        offsets = np.zeros(len(chosen) + 1, dtype=np.int64)
        np.cumsum(lengths[indices], out=offsets[1:])
        tokens = np.concatenate([np.zeros(0, np.int32), *(s.tokens for s in chosen)]).astype(np.int32)
        batches.append(
            Batch.from_arrays(
                step=step,
                rank=rank,
                ranks=plan.ranks,
                micro_batches=plan.micro_batches,
                capacity=plan.capacity,
                sample_ids=[s.sample_id for s in chosen],
                sources=[s.source for s in chosen],
                micro_batch=micro_batch,
                offsets=offsets,
                tokens=tokens,
            )
        )
    return batches
