"""What a context-parallel step holds, from the batches its ranks were written (format version 2 or 3): the plan they
carry (each sample's block and micro-batch), the block sizes used, each rank's micro-batches, and the step's time
under the job's cost against the lower bound and against static context parallelism sized for the step's longest
sample. Every time comes from the planner's own functions (``CPPlan.step_time``, ``lower_bound``, ``plan_cp_step``
with ``static_shape``), none from a formula of its own. Pure: no Kafka.

A rank's topic numbers its micro-batches from 0 in the order it runs them, empty ones left out, so the plan's
micro-batch indices are not written; the ranks of a block run its micro-batches in the same order, and so each
block micro-batch is given the first index after the ones its ranks ran before it (``written_plan``). The step's
time depends only on that order: a rank runs its micro-batches in turn and a block's ranks start one together.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from pipeline.planning.scheduler.context_parallel import (
    CPPlan,
    CPShape,
    cp_shape_of,
    lower_bound,
    plan_cp_step,
    static_shape,
)
from pipeline.spec import JobSpec
from pipeline.spec.cp_cost import ContextParallelCost
from topics.errors import MixflowError
from topics.formats.batch import Batch
from topics.formats.cp_batch import CPBatch


@dataclass(frozen=True)
class CPWeighing:
    """A context-parallel job's step shape (``step.context_parallel``) and what a sample costs a block's ranks
    (``cost.context_parallel``), both the spec's."""

    shape: CPShape
    cost: ContextParallelCost

    @classmethod
    def for_spec(cls, spec: JobSpec) -> CPWeighing | None:
        """The spec's; None for a job without ``step.context_parallel``."""
        shape = cp_shape_of(spec.step)
        return None if shape is None else cls(shape, spec.cost.context_parallel_cost())

    def of_step(self, batches: Sequence[CPBatch]) -> CPShape:
        """The shape of a written step: the spec's, with the most micro-batches a rank the step was written with;
        a step of other ranks, capacity or mode than the spec's is refused (``MixflowError``)."""
        first = batches[0]
        written = (first.ranks, first.capacity, first.mode)
        if written != (self.shape.ranks, self.shape.capacity, self.shape.mode.value):
            msg = (
                f"step {first.step} was written for {first.ranks} ranks of {first.capacity} tokens in {first.mode} "
                f"mode, the spec's step says {self.shape.ranks} ranks of {self.shape.capacity} tokens in "
                f"{self.shape.mode.value} mode: give the job's own spec"
            )
            raise MixflowError(msg)
        most = max(self.shape.micro_batches, first.max_micro_batches)
        return replace(self.shape, max_micro_batches=most)


def no_context_parallel(batch: Batch | CPBatch) -> MixflowError:
    """The refusal of a context-parallel batch read under a spec without ``step.context_parallel``."""
    return MixflowError(
        f"step {batch.step} rank {batch.rank} holds a context-parallel batch (format version 2 or 3) but the "
        "spec has no step.context_parallel: give the job's own spec"
    )


def counted_rows(batch: Batch | CPBatch) -> np.ndarray:
    """The rows of ``batch`` that count their sample once in a step (bool): every row of a batch of whole
    samples; of a context-parallel batch, those of the first rank of their block (``cp_rank`` 0)."""
    if isinstance(batch, CPBatch):
        return batch.cp_rank == 0
    return np.ones(batch.num_samples, dtype=bool)


def counted_sources(batch: Batch | CPBatch) -> tuple[list[str], np.ndarray]:
    """The sources and lengths (int64) of the samples ``batch`` counts (``counted_rows``)."""
    lengths = np.asarray(batch.lengths, dtype=np.int64)
    if not isinstance(batch, CPBatch):
        return batch.sources, lengths
    own = counted_rows(batch)
    sources = batch.sources
    return [sources[i] for i in np.flatnonzero(own).tolist()], lengths[own]


def counted_ids(batch: Batch | CPBatch) -> list[str]:
    """The ids of the samples ``batch`` counts (``counted_rows``)."""
    if not isinstance(batch, CPBatch):
        return batch.sample_ids
    ids = batch.sample_ids
    return [ids[i] for i in np.flatnonzero(counted_rows(batch)).tolist()]


@dataclass(frozen=True)
class _Rows:
    """A context-parallel batch's columns that place its rows, read once (each read is a conversion)."""

    ids: list[str]
    micro: np.ndarray
    size: np.ndarray
    rank_in: np.ndarray
    lengths: np.ndarray
    micro_batches: int

    @classmethod
    def of(cls, batch: CPBatch) -> _Rows:
        return cls(
            batch.sample_ids, batch.micro_batch, batch.cp_size, batch.cp_rank, batch.lengths, batch.micro_batches
        )


def _run_order(rows: Sequence[_Rows]) -> list[list[tuple[int, int, tuple[str, ...]]]]:
    """Per rank, its micro-batches in the order it runs them, each as (block's first rank, block size, its sample
    ids): the same key on every rank of the block."""
    out = []
    for r, b in enumerate(rows):
        bounds = np.searchsorted(b.micro, np.arange(b.micro_batches + 1)).tolist()
        size, rank_in = b.size.tolist(), b.rank_in.tolist()
        out.append([(r - rank_in[lo], size[lo], tuple(b.ids[lo:hi])) for lo, hi in itertools.pairwise(bounds)])
    return out


def _block_levels(order: list[list[tuple[int, int, tuple[str, ...]]]]) -> dict[tuple, int]:
    """Each block micro-batch's index: the first after those its ranks ran before it. ``ValueError`` where the
    ranks of a block do not run its micro-batches alike."""
    head = [0] * len(order)
    free = [0] * len(order)
    level: dict[tuple, int] = {}
    left = sum(len(keys) for keys in order)
    while left:
        moved = False
        for r, keys in enumerate(order):
            while head[r] < len(keys):
                key = keys[head[r]]
                block = range(key[0], key[0] + key[1])
                if any(head[q] >= len(order[q]) or order[q][head[q]] != key for q in block):
                    break
                level[key] = max(free[q] for q in block)
                for q in block:
                    free[q], head[q] = level[key] + 1, head[q] + 1
                left -= len(block)
                moved = True
        if not moved:
            stuck = next(order[r][head[r]] for r in range(len(order)) if head[r] < len(order[r]))
            msg = f"the ranks of the block of {stuck[1]} from rank {stuck[0]} do not run its micro-batches alike"
            raise ValueError(msg)
    return level


def written_plan(batches: Sequence[CPBatch], shape: CPShape) -> tuple[np.ndarray, CPPlan]:
    """The plan a step's batches (rank order) carry: its samples' lengths (int64; rank after rank, each rank's
    rows of ``cp_rank`` 0) and their ``CPPlan`` under ``shape`` (its ``max_micro_batches`` raised where the
    written micro-batches need more)."""
    rows = [_Rows.of(batch) for batch in batches]
    order = _run_order(rows)
    levels = _block_levels(order)
    first, size, micro, lengths = [], [], [], []
    for r, b in enumerate(rows):
        own = b.rank_in == 0
        first += [r] * int(own.sum())
        size += b.size[own].tolist()
        micro += [levels[order[r][k]] for k in b.micro[own].tolist()]
        lengths += b.lengths[own].tolist()
    most = max(shape.max_micro_batches, max(micro, default=-1) + 1)
    plan = CPPlan(
        np.array(first, np.int32),
        np.array(size, np.int32),
        np.array(micro, np.int32),
        replace(shape, max_micro_batches=most),
    )
    return np.array(lengths, np.int64), plan


@dataclass(frozen=True)
class CPStepStats:
    """One context-parallel step, as written: its block sizes, micro-batches and times (seconds of the job's cost
    model, ``cost.context_parallel``)."""

    mode: str
    sizes: np.ndarray  # (B,) the block sizes its samples have, ascending
    samples_at: np.ndarray  # (B,) samples on blocks of each size
    tokens_at: np.ndarray  # (B,) their tokens (unpadded)
    micro_batches: np.ndarray  # (R,) the micro-batches each rank runs
    rank_times: np.ndarray  # (R,) seconds of each rank's slices (``CPPlan.rank_times``)
    step_s: float  # the step's time (``CPPlan.step_time``): ranks run in turn, a block's ranks start together
    bound_s: float  # no plan of these samples in the job's mode takes less (``lower_bound``)
    static_s: float | None  # the same samples under static CP sized for the longest one; None: ranks not whole blocks
    static_size: int | None  # that static block size
    static_deferred: int  # samples static CP leaves out of the step (its time is without them)
    static_tokens: int  # the tokens static CP places

    @property
    def tokens(self) -> int:
        return int(self.tokens_at.sum())

    @property
    def over_bound(self) -> float:
        """The step's time over the lower bound (1 for a step of no time)."""
        return self.step_s / self.bound_s if self.bound_s > 0 else 1.0

    @property
    def static_over_written(self) -> float | None:
        """Static CP's time over the step's as written: how many times longer static would take."""
        if self.static_s is None:
            return None
        return self.static_s / self.step_s if self.step_s > 0 else 1.0

    @property
    def throughput_over_static(self) -> float | None:
        """Tokens a second as written over static CP's (``CPPlan.tokens_per_second`` of each): above 1, the step
        as written trains faster, the samples static CP defers counted against it."""
        if self.static_s is None or not self.static_tokens or self.step_s <= 0:
            return None
        return (self.tokens / self.step_s) / (self.static_tokens / self.static_s)


def cp_step_stats(batches: Sequence[CPBatch], weighing: CPWeighing) -> CPStepStats:
    """The numbers of one context-parallel step from the batch of every rank (rank order)."""
    shape = weighing.of_step(batches)
    cost = weighing.cost
    lengths, plan = written_plan(batches, shape)
    sizes, block = np.unique(plan.cp, return_inverse=True)
    static_s, static_size, deferred, static_tokens = None, None, 0, 0
    try:
        static = static_shape(lengths, shape.ranks, shape.micro_batches, shape.capacity)
    except ValueError:  # the step's ranks are not whole blocks of the size its longest sample needs
        static = None
    if static is not None:
        static_plan = plan_cp_step(lengths, static, cost)
        static_s, static_size = static_plan.step_time(lengths, cost), static.size
        deferred = int((~static_plan.placed_mask).sum())
        static_tokens = int(lengths[static_plan.placed_mask].sum())
    return CPStepStats(
        mode=shape.mode.value,
        sizes=sizes.astype(np.int64),
        samples_at=np.bincount(block, minlength=sizes.size).astype(np.int64),
        tokens_at=np.bincount(block, weights=lengths, minlength=sizes.size).astype(np.int64),
        micro_batches=np.array([b.micro_batches for b in batches], np.int64),
        rank_times=plan.rank_times(lengths, cost),
        step_s=plan.step_time(lengths, cost),
        bound_s=lower_bound(lengths, shape, cost),
        static_s=static_s,
        static_size=static_size,
        static_deferred=deferred,
        static_tokens=static_tokens,
    )
