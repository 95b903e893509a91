"""Per micro-batch views of a ``CPBatch`` as Megatron-Core's packed sequences take them under context
parallelism (``PackedSeqParams`` with ``cu_seqlens_padded``), already cut for this rank, with numpy only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topics.formats.cp_batch import CPBatch


@dataclass(frozen=True, slots=True)
class PackedCPMicroBatch:
    """One micro-batch of a rank: the slices of its ``k`` samples, concatenated.

    ``token_ids`` int32 [T] (padding included), ``labels`` int64 [T] (``IGNORE_INDEX`` at each sample's last
    token and at padding), ``position_ids`` int32 [T] (each token's position in its sample); ``cu_seqlens`` int32
    [k + 1], ``0`` then the running sum of the samples' whole lengths, and ``cu_seqlens_padded`` the same of
    their lengths padded to ``2 * local_cp_size``: the sequences the block's ranks compute together, of which
    this rank holds ``1 / local_cp_size``; ``max_seqlen`` the longest padded sample; ``local_cp_size`` the
    block's ranks and ``cp_rank`` this rank's place in it."""

    token_ids: np.ndarray
    labels: np.ndarray
    position_ids: np.ndarray
    cu_seqlens: np.ndarray
    cu_seqlens_padded: np.ndarray
    max_seqlen: int
    local_cp_size: int
    cp_rank: int
    sample_ids: list[str]


def pack_cp_micro_batches(batch: CPBatch) -> list[PackedCPMicroBatch]:
    """The rank's ``batch.micro_batches`` micro-batches, in the order it runs them."""
    tokens, labels, positions, offsets = batch.tokens, batch.labels, batch.positions, batch.offsets
    lengths, size, rank_in, ids = batch.lengths.astype(np.int64), batch.cp_size, batch.cp_rank, batch.sample_ids
    padded = np.diff(offsets) * size  # each slice holds P / c tokens
    first = np.searchsorted(batch.micro_batch, np.arange(batch.micro_batches + 1), side="left")
    packed = []
    for m in range(batch.micro_batches):
        lo, hi = int(first[m]), int(first[m + 1])
        start, stop = int(offsets[lo]), int(offsets[hi])
        packed.append(
            PackedCPMicroBatch(
                token_ids=tokens[start:stop],
                labels=labels[start:stop].astype(np.int64),
                position_ids=positions[start:stop],
                cu_seqlens=np.concatenate([[0], np.cumsum(lengths[lo:hi])]).astype(np.int32),
                cu_seqlens_padded=np.concatenate([[0], np.cumsum(padded[lo:hi])]).astype(np.int32),
                max_seqlen=int(padded[lo:hi].max()),
                local_cp_size=int(size[lo]),
                cp_rank=int(rank_in[lo]),
                sample_ids=ids[lo:hi],
            )
        )
    return packed
