"""Turn a planned step into one batch per rank: each rank's samples packed micro-batch by micro-batch into a
``Batch`` (the constructor encodes them). The plan is the step core's (``assemble_planned``); only
``assemble_step``, for tests and benchmarks without a step core, plans its candidates itself. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

from pipeline.planning.scheduler import CostModel, StepPlan, plan_step, rank_orders
from pipeline.planning.scheduler.context_parallel import CPPlan
from pipeline.planning.shape import StepShape
from pipeline.planning.step.assemble_cp import build_cp_batches
from pipeline.planning.step.core import PlannedStep
from pipeline.planning.step.pool import Candidate
from pipeline.spec import JobSpec
from topics.formats.batch import Batch, any_loss_spans
from topics.formats.cp_batch import CPBatch
from topics.formats.loss_spans import sample_bounds
from topics.formats.sample import Sample


@dataclass(frozen=True)
class BatchFormat:
    """What a job's batches carry besides tokens: the media column (a job with a multimodal source; then every
    batch has it, empty or not) and the patch budget per micro-batch. The ``loss_spans`` column is in every
    batch of a job with media (whose conversations name their targets), and in any step where a sample names
    them."""

    with_media: bool = False
    patches_per_micro_batch: int | None = None

    @classmethod
    def of(cls, spec: JobSpec) -> BatchFormat:
        with_media = any(source.multimodal for source in spec.sources)
        return cls(with_media, spec.step.patches_per_micro_batch if with_media else None)


TEXT = BatchFormat()


@dataclass(frozen=True)
class AssembledStep:
    step: int
    batches: list[Batch] | list[CPBatch]
    delivered: list[Candidate]
    deferred: list[Candidate]
    plan: StepPlan | CPPlan
    lengths: np.ndarray
    started: bool = False  # planned from a placement of composition's too (it packed the holes)
    encoder_costs: np.ndarray | None = None  # each candidate's cost in the vision encoder (None: text)

    @property
    def tokens(self) -> int:
        return int(self.lengths[self.plan.placed_mask].sum())

    def rank_costs(self, cost_model: CostModel) -> np.ndarray:
        """Each rank's cost, as the step was balanced: its samples' LLM cost plus their vision encoder's."""
        costs = self.plan.rank_costs(self.lengths, cost_model)
        return costs if self.encoder_costs is None else costs + self.plan.rank_totals(self.encoder_costs)


def assemble_step(
    step: int,
    candidates: Sequence[Candidate],
    shape: StepShape,
    cost_model: CostModel,
    start: np.ndarray | None = None,
) -> AssembledStep:
    """Plan ``candidates`` (priority order, oldest first) over the step's ranks and micro-batches, from the
    placement ``start`` too where given (``plan_step``), and build each rank's batch, micro-batch by
    micro-batch. Unplaced candidates come back as deferred."""
    lengths = np.fromiter((c.sample.length for c in candidates), dtype=np.int64, count=len(candidates))
    plan = plan_step(lengths, shape.ranks, shape.micro_batches, shape.tokens_per_micro_batch, cost_model, start=start)
    return _assembled(step, candidates, plan, lengths, start is not None)


def assemble_planned(
    planned: PlannedStep, candidates: Sequence[Candidate], batch_format: BatchFormat = TEXT
) -> AssembledStep:
    """The batches of a step the step core planned; ``candidates`` in ``planned.order`` (``SamplePool.take``)."""
    assembled = _assembled(planned.step, candidates, planned.plan, planned.lengths, planned.started, batch_format)
    return replace(assembled, encoder_costs=planned.encoder_costs)


def _assembled(
    step: int,
    candidates: Sequence[Candidate],
    plan: StepPlan | CPPlan,
    lengths: np.ndarray,
    started: bool,
    batch_format: BatchFormat = TEXT,
) -> AssembledStep:
    """Each rank's batch of ``plan`` of ``candidates`` (``lengths`` theirs); the unplaced ones as deferred. A
    context-parallel plan gives each rank its slices (``build_cp_batches``)."""
    samples = [c.sample for c in candidates]
    batches: list[Batch] | list[CPBatch]
    if isinstance(plan, CPPlan):
        batches = build_cp_batches(step, plan, samples)
    else:
        batches = build_batches(step, plan, samples, lengths, batch_format)
    placed = plan.placed_mask.tolist()
    delivered = [c for c, p in zip(candidates, placed, strict=True) if p]
    deferred = [c for c, p in zip(candidates, placed, strict=True) if not p]
    return AssembledStep(step, batches, delivered, deferred, plan, lengths, started)


def build_batches(
    step: int, plan: StepPlan, samples: Sequence[Sample], lengths: np.ndarray, batch_format: BatchFormat = TEXT
) -> list[Batch]:
    """One batch per rank of ``plan`` (its shape and capacity) in ``batch_format``, holding the ``samples`` it
    places there, micro-batch by micro-batch in ``rank_order``; ``lengths`` are the samples' token counts."""
    with_media = batch_format.with_media
    with_spans = with_media or any_loss_spans(samples)
    orders = rank_orders(plan)
    # Each source name once, and each sample's index into them: a rank's source column is built from these.
    names: dict[str, int] = {}
    codes = np.fromiter((names.setdefault(s.source, len(names)) for s in samples), np.int32, len(samples))
    name_list = list(names)
    batches = []
    for rank in range(plan.ranks):
        indices, micro_batch = orders.of(rank)
        picked = indices.tolist()
        offsets = np.zeros(len(picked) + 1, dtype=np.int64)
        np.cumsum(lengths[indices], out=offsets[1:])
        tokens = np.concatenate([np.zeros(0, np.int32), *(samples[i].tokens for i in picked)], dtype=np.int32)
        batches.append(
            Batch.from_arrays(
                step=step,
                rank=rank,
                ranks=plan.ranks,
                micro_batches=plan.micro_batches,
                capacity=plan.capacity,
                sample_ids=[samples[i].sample_id for i in picked],
                sources=_source_column(codes[indices], name_list),
                micro_batch=micro_batch,
                offsets=offsets,
                tokens=tokens,
                with_media=with_media,
                media=[samples[i].media for i in picked] if with_media else None,
                patches_per_micro_batch=batch_format.patches_per_micro_batch,
                loss_spans=[sample_bounds(samples[i].metadata, len(samples[i].tokens)) for i in picked]
                if with_spans
                else None,
                trusted=True,  # the plan places at most capacity tokens a micro-batch, in micro-batch order
            )
        )
    return batches


def _source_column(codes: np.ndarray, names: list[str]) -> pa.DictionaryArray:
    """The dictionary column ``pa.array([names[c] for c in codes]).dictionary_encode()`` makes (its values in
    order of first appearance), from the codes."""
    present, first = np.unique(codes, return_index=True)
    order = present[np.argsort(first)]  # the codes in order of first appearance
    index_of = np.zeros(len(names), np.int32)
    index_of[order] = np.arange(len(order), dtype=np.int32)
    dictionary = pa.array([names[c] for c in order.tolist()], pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(index_of[codes], pa.int32()), dictionary)
