"""Turn a context-parallel plan into one ``CPBatch`` per rank: every rank of a sample's block gets its slice of
the sample (``topics.formats.cp_slices``), and each rank's micro-batches are numbered from 0 in the order it runs
them (the plan's micro-batch order, empty ones left out). Pure."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipeline.planning.scheduler.context_parallel import CPPlan
from topics.formats.cp_batch import CPBatch
from topics.formats.cp_slices import slice_of
from topics.formats.sample import Sample


def build_cp_batches(step: int, plan: CPPlan, samples: Sequence[Sample], pad_id: int = 0) -> list[CPBatch]:
    """One batch per rank of ``plan`` of ``samples`` (``plan``'s candidates, in its order): for each sample
    placed on a block, each rank of the block holds slice ``rank - first`` of it (``pad_id`` at padding)."""
    shape = plan.shape
    placed = np.flatnonzero(plan.placed_mask)
    cp = plan.cp[placed].astype(np.int64)
    # One entry a (sample, rank of its block): its rank, micro-batch, sample and place in the block.
    sample = np.repeat(placed, cp)
    offset = np.arange(int(cp.sum())) - np.repeat(np.cumsum(cp) - cp, cp)
    rank = plan.rank[sample].astype(np.int64) + offset
    micro = plan.micro[sample].astype(np.int64)
    order = np.lexsort((sample, micro, rank))
    sample, offset, rank, micro = sample[order], offset[order], rank[order], micro[order]
    bounds = np.searchsorted(rank, np.arange(shape.ranks + 1))
    lengths = np.fromiter((s.length for s in samples), np.int64, len(samples))
    loss_tokens = int((lengths[placed] - 1).sum())
    batches = []
    for r in range(shape.ranks):
        rows = slice(bounds[r], bounds[r + 1])
        picked, within = sample[rows].tolist(), offset[rows].tolist()
        sizes = plan.cp[sample[rows]]
        parts = [slice_of(samples[i].tokens, int(plan.cp[i]), o, pad_id) for i, o in zip(picked, within, strict=True)]
        offsets = np.zeros(len(parts) + 1, np.int64)
        np.cumsum([p[0].size for p in parts], out=offsets[1:])
        batches.append(
            CPBatch.from_arrays(
                step=step,
                rank=r,
                ranks=shape.ranks,
                max_micro_batches=shape.max_micro_batches,
                capacity=shape.capacity,
                mode=shape.mode.value,
                loss_tokens=loss_tokens,
                sample_ids=[samples[i].sample_id for i in picked],
                sources=[samples[i].source for i in picked],
                micro_batch=_numbered(micro[rows]),
                lengths=lengths[sample[rows]],
                cp_size=sizes,
                cp_rank=offset[rows],
                offsets=offsets,
                tokens=_joined([p[0] for p in parts]),
                labels=_joined([p[1] for p in parts]),
                positions=_joined([p[2] for p in parts]),
                trusted=True,
            )
        )
    return batches


def _numbered(micro: np.ndarray) -> np.ndarray:
    """The plan's micro-batch indices of a rank's rows (non-decreasing) as 0, 1, ... with no gaps."""
    return np.unique(micro, return_inverse=True)[1].astype(np.int32)


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.zeros(0, np.int32), *parts]).astype(np.int32, copy=False)
