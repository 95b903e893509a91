"""Per micro-batch views of a ``Batch`` in the packed (varlen attention) layout, with numpy only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topics.formats.batch import Batch
from topics.formats.loss_spans import IGNORE_INDEX, next_token_labels

__all__ = ["IGNORE_INDEX", "PackedMicroBatch", "pack_micro_batches"]


@dataclass(frozen=True, slots=True)
class PackedMicroBatch:
    """One micro-batch with its samples concatenated, as varlen attention kernels and Megatron's packed
    sequences take them.

    ``token_ids`` int32 [T], a view into the batch; ``cu_seqlens`` int32 [k + 1], sample ``j`` is
    ``token_ids[cu_seqlens[j]:cu_seqlens[j + 1]]``; ``position_ids`` int32 [T], restarting at 0 at
    every sample; ``labels`` int64 [T], the next token of the same sample where that is a target of the loss
    (the batch's ``loss_spans``; every token without them), ``IGNORE_INDEX`` elsewhere and on each sample's
    last token; ``max_seqlen`` the longest sample (0 when empty); ``sample_ids`` the k ids.
    """

    token_ids: np.ndarray
    cu_seqlens: np.ndarray
    position_ids: np.ndarray
    labels: np.ndarray
    max_seqlen: int
    sample_ids: list[str]


def pack_micro_batches(batch: Batch) -> list[PackedMicroBatch]:
    """``batch.micro_batches`` packed micro-batches, empty ones included, in order."""
    tokens, offsets, sample_ids = batch.tokens, batch.offsets, batch.sample_ids
    lengths = np.diff(offsets)
    # Rows are ordered by micro-batch: rows[first[m]:first[m + 1]] belong to micro-batch m.
    first = np.searchsorted(batch.micro_batch, np.arange(batch.micro_batches + 1), side="left")
    positions = (np.arange(tokens.size, dtype=np.int64) - np.repeat(offsets[:-1], lengths)).astype(np.int32)
    # Samples never cross micro-batches, so one shifted copy serves every micro-batch.
    labels = next_token_labels(tokens, offsets, batch.targets())
    packed = []
    for m in range(batch.micro_batches):
        lo, hi = int(first[m]), int(first[m + 1])
        start, stop = int(offsets[lo]), int(offsets[hi])
        packed.append(
            PackedMicroBatch(
                token_ids=tokens[start:stop],
                cu_seqlens=(offsets[lo : hi + 1] - start).astype(np.int32),
                position_ids=positions[start:stop],
                labels=labels[start:stop],
                max_seqlen=int(lengths[lo:hi].max()) if hi > lo else 0,
                sample_ids=sample_ids[lo:hi],
            )
        )
    return packed
