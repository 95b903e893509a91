"""Turn a planned step into one batch per rank: each rank's samples packed micro-batch by micro-batch into a
``Batch`` (the constructor encodes them). The plan is the step core's (``assemble_planned``); only
``assemble_step``, for tests and benchmarks without a step core, plans its candidates itself. Pure."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

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
class StepSummary:
    """What the bookkeeping of a written step needs (its plan, costs and counts by source), without its
    samples: a step's tokens and pixels are not held past its encoding."""

    step: int
    plan: StepPlan | CPPlan
    lengths: np.ndarray
    started: bool  # planned from a placement of composition's too (it packed the holes)
    encoder_costs: np.ndarray | None  # each candidate's cost in the vision encoder (None: text)
    samples_by_source: dict[str, int]
    tokens_by_source: dict[str, int]
    deferred: int
    media_by_kind: dict[str, int] = field(default_factory=dict)  # the images and clips delivered

    @property
    def tokens(self) -> int:
        return int(self.lengths[self.plan.placed_mask].sum())

    @property
    def samples(self) -> int:
        return sum(self.samples_by_source.values())

    def rank_costs(self, cost_model: CostModel) -> np.ndarray:
        """Each rank's cost, as the step was balanced: its samples' LLM cost plus their vision encoder's."""
        costs = self.plan.rank_costs(self.lengths, cost_model)
        return costs if self.encoder_costs is None else costs + self.plan.rank_totals(self.encoder_costs)


@dataclass(frozen=True)
class AssembledStep:
    """A planned step and its ``candidates`` in the order planned. Each rank's batch is built when asked for:
    ``iter_batches`` leaves the step as it is, ``drain_batches`` lets go of each rank's samples once its batch
    is built, so that a writer holds one rank's batch and the samples not yet encoded beside what it has
    encoded."""

    step: int
    candidates: list[Candidate]
    plan: StepPlan | CPPlan
    lengths: np.ndarray
    started: bool = False  # planned from a placement of composition's too (it packed the holes)
    encoder_costs: np.ndarray | None = None  # each candidate's cost in the vision encoder (None: text)
    batch_format: BatchFormat = field(default_factory=BatchFormat)

    @property
    def delivered(self) -> list[Candidate]:
        return [c for c, p in zip(self.candidates, self.plan.placed_mask.tolist(), strict=True) if p]

    @property
    def deferred(self) -> list[Candidate]:
        return [c for c, p in zip(self.candidates, self.plan.placed_mask.tolist(), strict=True) if not p]

    @property
    def batches(self) -> list[Batch] | list[CPBatch]:
        return list(self.iter_batches())  # type: ignore[return-value]

    def iter_batches(self) -> Iterator[Batch] | Iterator[CPBatch]:
        """Each rank's batch, in rank order, built as it is taken. A context-parallel plan gives each rank its
        slices (``build_cp_batches``)."""
        return self._batches([c.sample for c in self.candidates], release=False)

    def drain_batches(self) -> Iterator[Batch] | Iterator[CPBatch]:
        """``iter_batches``, the step's candidates let go of at once and each sample once its rank's batch is
        built: the step has no candidates after (take its ``summary`` first)."""
        samples: list[Sample | None] = [c.sample for c in self.candidates]
        self.candidates.clear()
        return self._batches(samples, release=True)

    def _batches(self, samples: list[Sample | None], release: bool) -> Iterator[Batch] | Iterator[CPBatch]:
        if isinstance(self.plan, CPPlan):
            return iter(build_cp_batches(self.step, self.plan, samples))  # type: ignore[arg-type]
        return iter_batches(self.step, self.plan, samples, self.lengths, self.batch_format, release)

    def summary(self) -> StepSummary:
        samples: dict[str, int] = {}
        tokens: dict[str, int] = {}
        media: dict[str, int] = {}
        for c in self.delivered:
            samples[c.ref.source] = samples.get(c.ref.source, 0) + 1
            tokens[c.ref.source] = tokens.get(c.ref.source, 0) + c.sample.length
            for item in c.sample.media:
                media[item.kind] = media.get(item.kind, 0) + 1
        deferred = len(self.candidates) - sum(samples.values())
        return StepSummary(
            self.step, self.plan, self.lengths, self.started, self.encoder_costs, samples, tokens, deferred, media
        )


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
    return AssembledStep(step, list(candidates), plan, lengths, started, batch_format=batch_format)


def build_batches(
    step: int, plan: StepPlan, samples: Sequence[Sample], lengths: np.ndarray, batch_format: BatchFormat = TEXT
) -> list[Batch]:
    """Every rank's batch of ``plan`` (``iter_batches``)."""
    return list(iter_batches(step, plan, samples, lengths, batch_format))


def iter_batches(
    step: int,
    plan: StepPlan,
    samples: Sequence[Sample] | list[Sample | None],
    lengths: np.ndarray,
    batch_format: BatchFormat = TEXT,
    release: bool = False,
) -> Iterator[Batch]:
    """One batch per rank of ``plan`` (its shape and capacity) in ``batch_format``, holding the ``samples`` it
    places there, micro-batch by micro-batch in ``rank_order``; ``lengths`` are the samples' token counts.
    With ``release``, each rank's entries of ``samples`` (a list) are set to None once its batch is built."""
    held = cast(list[Sample], samples)  # every entry is a sample until this lets go of it
    with_media = batch_format.with_media
    with_spans = with_media or any_loss_spans(held)
    orders = rank_orders(plan)
    # Each source name once, and each sample's index into them: a rank's source column is built from these.
    names: dict[str, int] = {}
    codes = np.fromiter((names.setdefault(s.source, len(names)) for s in held), np.int32, len(held))
    name_list = list(names)
    for rank in range(plan.ranks):
        indices, micro_batch = orders.of(rank)
        picked = indices.tolist()
        ranked = [held[i] for i in picked]
        if release:
            for i in picked:
                samples[i] = None  # type: ignore[index]
        offsets = np.zeros(len(picked) + 1, dtype=np.int64)
        np.cumsum(lengths[indices], out=offsets[1:])
        tokens = np.concatenate([np.zeros(0, np.int32), *(s.tokens for s in ranked)], dtype=np.int32)
        batch = Batch.from_arrays(
            step=step,
            rank=rank,
            ranks=plan.ranks,
            micro_batches=plan.micro_batches,
            capacity=plan.capacity,
            sample_ids=[s.sample_id for s in ranked],
            sources=_source_column(codes[indices], name_list),
            micro_batch=micro_batch,
            offsets=offsets,
            tokens=tokens,
            with_media=with_media,
            media=[s.media for s in ranked] if with_media else None,
            patches_per_micro_batch=batch_format.patches_per_micro_batch,
            loss_spans=[sample_bounds(s.metadata, len(s.tokens)) for s in ranked] if with_spans else None,
            trusted=True,  # the plan places at most capacity tokens a micro-batch, in micro-batch order
        )
        del ranked, tokens  # the batch holds copies: a released rank's samples go now, not after its encoding
        yield batch


def _source_column(codes: np.ndarray, names: list[str]) -> pa.DictionaryArray:
    """The dictionary column ``pa.array([names[c] for c in codes]).dictionary_encode()`` makes (its values in
    order of first appearance), from the codes."""
    present, first = np.unique(codes, return_index=True)
    order = present[np.argsort(first)]  # the codes in order of first appearance
    index_of = np.zeros(len(names), np.int32)
    index_of[order] = np.arange(len(order), dtype=np.int32)
    dictionary = pa.array([names[c] for c in order.tolist()], pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(index_of[codes], pa.int32()), dictionary)
