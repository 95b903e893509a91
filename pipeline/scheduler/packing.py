"""``pack_rank``: one rank's samples in output order, with the arrays a varlen attention kernel needs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.scheduler._args import check_lengths
from pipeline.scheduler.plan import StepPlan


@dataclass(frozen=True, eq=False)
class RankPacking:
    """The samples of one rank, micro-batch after micro-batch, oldest first within a micro-batch.

    ``indices`` (int64) are sample indices in output order and ``micro_batch`` (int32) the micro-batch
    of each. Per micro-batch ``m``: ``cu_seqlens[m]`` (int32) the cumulative token offsets of its samples,
    starting at 0, one entry more than samples; ``position_ids[m]`` (int64) restarting at 0 at every
    sample; ``max_seqlen[m]`` its longest sample (0 when empty). As flash-attn's varlen functions and
    Megatron's packed sequences take them.
    """

    rank: int
    indices: np.ndarray
    micro_batch: np.ndarray
    cu_seqlens: tuple[np.ndarray, ...]
    position_ids: tuple[np.ndarray, ...]
    max_seqlen: tuple[int, ...]

    def micro_batch_indices(self, micro: int) -> np.ndarray:
        """Sample indices of micro-batch ``micro``, in output order."""
        return self.indices[self.micro_batch == micro]


def pack_rank(plan: StepPlan, lengths: np.ndarray, rank: int) -> RankPacking:
    """Order and pack the samples ``plan`` gives to ``rank``."""
    lengths = check_lengths(lengths)
    if lengths.shape != plan.rank.shape:
        msg = f"lengths has {lengths.size} entries but the plan has {plan.rank.size}"
        raise ValueError(msg)
    if isinstance(rank, bool) or not isinstance(rank, int | np.integer) or not 0 <= rank < plan.ranks:
        msg = f"rank must be an integer in [0, {plan.ranks}), got {rank!r}"
        raise ValueError(msg)
    mine = np.flatnonzero(plan.rank == rank)  # ascending: oldest first
    by_micro = np.argsort(plan.micro[mine], kind="stable")
    indices = mine[by_micro]
    micro_batch = plan.micro[indices]
    bounds = np.searchsorted(micro_batch, np.arange(plan.micro_batches + 1))
    cu_seqlens, position_ids, max_seqlen = [], [], []
    for m in range(plan.micro_batches):
        sample_lengths = lengths[indices[bounds[m] : bounds[m + 1]]]
        cu = np.zeros(sample_lengths.size + 1, np.int32)
        np.cumsum(sample_lengths, out=cu[1:])
        starts = np.repeat(cu[:-1].astype(np.int64), sample_lengths)
        cu_seqlens.append(cu)
        position_ids.append(np.arange(int(cu[-1]), dtype=np.int64) - starts)
        max_seqlen.append(int(sample_lengths.max()) if sample_lengths.size else 0)
    return RankPacking(
        rank=int(rank),
        indices=indices.astype(np.int64),
        micro_batch=micro_batch.astype(np.int32),
        cu_seqlens=tuple(cu_seqlens),
        position_ids=tuple(position_ids),
        max_seqlen=tuple(max_seqlen),
    )
