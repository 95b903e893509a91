"""What each written step holds, as numbers: rank costs and their imbalance, tokens per source, fill, and
what naive per-rank loading of the same samples would have given; for a multimodal job, each rank's cost
in two parts too, the vision encoder's and the LLM's, and the bound of each, the least largest rank cost any plan
of the step's samples could reach (``vision_parts.py``); for a context-parallel job, each
rank's time and the step's against the bound and static CP instead of naive loading (``cp_steps.py``). Pure.

Shared by ``mixflow top``, ``mixflow report`` and the end-of-job report of ``mixflow run``
(``pipeline/tools/observe/rank_topics.py``), so that the three agree on what imbalance, fill and share drift mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.planning.shape import StepShape
from pipeline.spec.cost import CostModel
from pipeline.tools.observe.cp_steps import CPStepStats, CPWeighing, counted_sources, cp_step_stats, no_context_parallel
from pipeline.tools.observe.naive import NaiveLoading, NaiveStream
from pipeline.tools.observe.vision_parts import (
    EncoderWeighing,
    PartBounds,
    RankParts,
    StepVision,
    over_mean,
    part_bounds,
    rank_sums,
    step_vision,
)
from topics.formats.batch import Batch
from topics.formats.cp_batch import CPBatch

HIGH_PERCENTILE = 95
"""Where the reports give more than the median of a per-step number over steps, this percentile too."""


def median_and_high(values: np.ndarray) -> tuple[float, float]:
    """The median and the ``HIGH_PERCENTILE``-th percentile of per-step ``values`` (NaN for none)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return float("nan"), float("nan")
    return float(np.median(values)), float(np.percentile(values, HIGH_PERCENTILE))


def imbalance(rank_costs: np.ndarray) -> np.ndarray:
    """Largest rank cost / mean rank cost along the last axis (1 for a step of no cost): how much longer
    the step takes than it would perfectly balanced."""
    costs = np.asarray(rank_costs, dtype=np.float64)
    mean = costs.mean(axis=-1)
    return np.divide(costs.max(axis=-1), mean, out=np.ones_like(mean), where=mean > 0)


@dataclass(frozen=True)
class StepStats:
    """One written step, from its rank batches. A context-parallel step's rank costs are each rank's seconds under
    ``cost.context_parallel`` and it has no naive loading (a sample over a micro-batch fits none): ``cp`` compares
    it with static context parallelism instead."""

    step: int
    rank_costs: np.ndarray  # (R,) cost of each rank's samples under the spec's cost model (both parts: ``parts``)
    tokens_by_source: np.ndarray  # (S,) in the order of the ``sources`` given to ``step_stats``
    samples: int
    capacity: int  # tokens the step can hold: ranks * micro_batches * capacity per micro-batch
    naive: NaiveLoading | None  # None for a context-parallel step
    parts: RankParts | None = None  # a multimodal job's: each rank's encoder and LLM cost, as written
    encoder: EncoderWeighing | None = None  # and how its encoder's part is weighed
    cp: CPStepStats | None = None  # a context-parallel step's blocks, micro-batches and times
    bounds: PartBounds | None = None  # a multimodal job's: the least largest rank cost of each part, any plan

    @property
    def tokens(self) -> int:
        return int(self.tokens_by_source.sum())

    @property
    def imbalance(self) -> float:
        return float(imbalance(self.rank_costs))

    @property
    def naive_imbalance(self) -> float:
        return float("nan") if self.naive is None else float(imbalance(self.naive.rank_costs))

    @property
    def encoder_imbalance(self) -> float | None:
        return None if self.parts is None else float(imbalance(self.parts.encoder))

    @property
    def llm_imbalance(self) -> float | None:
        return None if self.parts is None else float(imbalance(self.parts.llm))

    @property
    def naive_encoder_imbalance(self) -> float | None:
        return None if self.naive.parts is None else float(imbalance(self.naive.parts.encoder))

    @property
    def naive_llm_imbalance(self) -> float | None:
        return None if self.naive.parts is None else float(imbalance(self.naive.parts.llm))

    @property
    def bound_imbalance(self) -> float | None:
        """The least largest / mean rank cost (both parts) any plan of the step's samples could reach."""
        return None if self.bounds is None else over_mean(self.bounds.total, self.rank_costs)

    @property
    def encoder_bound_imbalance(self) -> float | None:
        return None if self.bounds is None or self.parts is None else over_mean(self.bounds.encoder, self.parts.encoder)

    @property
    def llm_bound_imbalance(self) -> float | None:
        return None if self.bounds is None or self.parts is None else over_mean(self.bounds.llm, self.parts.llm)

    @property
    def fill(self) -> float:
        return self.tokens / self.capacity

    @property
    def naive_fill(self) -> float:
        return float("nan") if self.naive is None else self.naive.tokens / self.capacity


def rank_costs(batches: Sequence[Batch], cost: CostModel) -> np.ndarray:
    """(R,) the cost of each rank's samples."""
    return np.array([cost.costs(b.lengths).sum() for b in batches])


def tokens_by_source(batches: Sequence[Batch | CPBatch], sources: Sequence[str]) -> np.ndarray:
    """(S,) the step's tokens of each of ``sources`` (a context-parallel sample's once, not once a slice); a
    source not among them raises ``ValueError``."""
    index = {s: i for i, s in enumerate(sources)}
    out = np.zeros(len(sources), dtype=np.int64)
    for b in batches:
        of_rows, lengths = counted_sources(b)
        for source, n in zip(of_rows, lengths.tolist(), strict=True):
            if source not in index:
                msg = f"step {b.step} rank {b.rank} holds a sample of source {source!r}, not one of {list(sources)}"
                raise ValueError(msg)
            out[index[source]] += n
    return out


def written_shape(batches: Sequence[Batch] | Sequence[CPBatch]) -> StepShape:
    """The shape a step's batches (rank order) were written for: ranks, the most micro-batches a rank, tokens and
    patches a micro-batch (0: no patch budget, as for a context-parallel batch)."""
    first = batches[0]
    micro_batches = max(b.micro_batches for b in batches)
    budget = first.patches_per_micro_batch if isinstance(first, Batch) else None
    return StepShape(first.ranks, micro_batches, first.capacity, budget or 0)


def written_parts(batches: Sequence[Batch], cost: CostModel, vision: StepVision) -> RankParts:
    """Each rank's encoder and LLM cost as the batches hold their samples (``vision``: the step's)."""
    rank_of = np.repeat(np.arange(len(batches)), [b.num_samples for b in batches])
    return RankParts(rank_sums(rank_of, vision.encoder_costs, len(batches)), rank_costs(batches, cost))


def step_stats(
    batches: Sequence[Batch] | Sequence[CPBatch],
    sources: Sequence[str],
    cost: CostModel,
    encoder: EncoderWeighing | None = None,
    cp: CPWeighing | None = None,
    naive: NaiveStream | None = None,
) -> StepStats:
    """The numbers of one step from the batch of every rank (rank order); with ``encoder`` (a multimodal
    job's), each rank's cost in two parts, the vision encoder's and the LLM's, besides their total; a
    context-parallel step's with ``cp`` (the job's), refused without it (``MixflowError``). ``naive``: the job's
    naive loading so far, which this step goes on (None: naive loading of this step's samples alone)."""
    first = batches[0]
    if isinstance(first, CPBatch):
        if cp is None:
            raise no_context_parallel(first)
        return _cp_step_stats(batches, sources, cp)
    lengths = np.concatenate([b.lengths for b in batches]).astype(np.int64)  # (n,) the step's order
    vision = step_vision(batches, encoder) if encoder is not None else None
    parts = written_parts(batches, cost, vision) if vision is not None else None
    bounds = None if vision is None else part_bounds(lengths, cost.costs(lengths), vision, written_shape(batches))
    return StepStats(
        step=first.step,
        rank_costs=rank_costs(batches, cost) if parts is None else parts.total(vision.in_total),
        tokens_by_source=tokens_by_source(batches, sources),
        samples=int(lengths.size),
        capacity=first.ranks * first.micro_batches * first.capacity,
        naive=(naive or NaiveStream(cost)).step(lengths, first.ranks, first.micro_batches, first.capacity, vision),
        parts=parts,
        encoder=encoder,
        bounds=bounds,
    )


def _cp_step_stats(batches: Sequence[CPBatch], sources: Sequence[str], cp: CPWeighing) -> StepStats:
    stats = cp_step_stats(batches, cp)
    return StepStats(
        step=batches[0].step,
        rank_costs=stats.rank_times,
        tokens_by_source=tokens_by_source(batches, sources),
        samples=int(stats.samples_at.sum()),
        capacity=cp.shape.ranks * cp.shape.micro_batches * cp.shape.capacity,
        naive=None,
        cp=stats,
    )


def cumulative_shares(per_step: np.ndarray) -> np.ndarray:
    """(K, S) each source's share of all tokens up to and including each step, from (K, S) tokens per
    step (rows of zeros before the first token are 0)."""
    totals = np.cumsum(np.asarray(per_step, dtype=np.float64), axis=0)
    return totals / np.maximum(totals.sum(axis=1, keepdims=True), 1e-12)


def scheduled_tokens(per_step: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(K, S) the tokens each source should have had by each step: every step's tokens split by the
    schedule's (K, S) ``weights`` at that step, summed."""
    step_tokens = np.asarray(per_step, dtype=np.float64).sum(axis=1, keepdims=True)  # (K, 1)
    return np.cumsum(weights * step_tokens, axis=0)


def schedule_drift(per_step: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(S,) the largest |tokens so far - tokens the schedule asks for so far| of each source over the steps."""
    per_step = np.asarray(per_step, dtype=np.float64)
    if per_step.shape[0] == 0:
        return np.zeros(per_step.shape[1])
    return np.abs(np.cumsum(per_step, axis=0) - scheduled_tokens(per_step, weights)).max(axis=0)
