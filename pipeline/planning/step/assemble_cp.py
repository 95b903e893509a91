"""Turn a context-parallel plan into one ``CPBatch`` per rank: every rank of a sample's block gets its slice of
the sample (``topics.formats.cp_slices``), and each rank's micro-batches are numbered from 0 in the order it runs
them (the plan's micro-batch order, empty ones left out). Pure."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipeline.planning.scheduler.context_parallel import CPPlan
from topics.formats.batch import any_loss_spans
from topics.formats.cp_batch import CPBatch
from topics.formats.cp_slices import IGNORE_INDEX, zigzag_positions
from topics.formats.loss_spans import next_token_labels, sample_bounds, target_mask
from topics.formats.sample import Sample


def build_cp_batches(step: int, plan: CPPlan, samples: Sequence[Sample], pad_id: int = 0) -> list[CPBatch]:
    """One batch per rank of ``plan`` of ``samples`` (``plan``'s candidates, in its order): for each sample
    placed on a block, each rank of the block holds slice ``rank - first`` of it (``pad_id`` at padding), its
    labels the next tokens that are targets of the loss (the samples' ``LOSS_SPANS_KEY``; every token without)."""
    shape = plan.shape
    placed = np.flatnonzero(plan.placed_mask)
    sample, offset = plan.slots()  # one entry a (sample, rank of its block)
    rank = plan.rank[sample].astype(np.int64) + offset
    micro = plan.micro[sample].astype(np.int64)
    order = np.lexsort((sample, micro, rank))
    sample, offset, rank, micro = sample[order], offset[order], rank[order], micro[order]
    bounds = np.searchsorted(rank, np.arange(shape.ranks + 1))
    lengths = np.fromiter((s.length for s in samples), np.int64, len(samples))
    # Every sample's tokens once, end to end: a slice is a gather from them.
    flat = np.concatenate([np.zeros(0, np.int32), *(samples[i].tokens for i in placed.tolist())], dtype=np.int32)
    start = np.zeros(len(samples), np.int64)
    start[placed] = np.cumsum(lengths[placed]) - lengths[placed]
    whole = np.concatenate([[0], np.cumsum(lengths[placed])])
    flat_labels = next_token_labels(flat, whole, _targets([samples[i] for i in placed.tolist()], whole))
    loss_tokens = int((flat_labels != IGNORE_INDEX).sum())
    positions, counts = zigzag_positions(lengths[sample], plan.cp[sample], offset)
    row = np.repeat(np.arange(sample.size), counts)
    length = lengths[sample][row]
    at = start[sample][row] + positions
    last = max(flat.size - 1, 0)  # a padding position's index, clipped: its value is replaced
    tokens = np.where(positions < length, flat[np.minimum(at, last)], pad_id)
    labels = np.where(positions < length, flat_labels[np.minimum(at, last)], IGNORE_INDEX)
    ends = np.concatenate([[0], np.cumsum(counts)])
    batches = []
    for r in range(shape.ranks):
        rows = slice(bounds[r], bounds[r + 1])
        picked = sample[rows].tolist()
        part = slice(ends[bounds[r]], ends[bounds[r + 1]])
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
                cp_size=plan.cp[sample[rows]],
                cp_rank=offset[rows],
                offsets=ends[bounds[r] : bounds[r + 1] + 1] - ends[bounds[r]],
                tokens=tokens[part],
                labels=labels[part],
                positions=positions[part],
                trusted=True,
            )
        )
    return batches


def _targets(samples: Sequence[Sample], offsets: np.ndarray) -> np.ndarray | None:
    """Which tokens of ``samples`` laid end to end at ``offsets`` are targets; None where every one is."""
    if not any_loss_spans(samples):
        return None
    bounds = [sample_bounds(s.metadata, s.length) for s in samples]
    counts = np.fromiter((b.size for b in bounds), np.int64, len(bounds))
    flat = np.concatenate([np.zeros(0, np.int32), *bounds])
    return target_mask(offsets, np.concatenate([[0], np.cumsum(counts)]), flat)


def _numbered(micro: np.ndarray) -> np.ndarray:
    """The plan's micro-batch indices of a rank's rows (non-decreasing) as 0, 1, ... with no gaps."""
    return np.unique(micro, return_inverse=True)[1].astype(np.int32)
