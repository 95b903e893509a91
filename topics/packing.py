"""Per micro-batch views of a ``Batch`` in the packed (varlen attention) layout, with numpy only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topics.batch import Batch


@dataclass(frozen=True, slots=True)
class PackedMicroBatch:
    """One micro-batch with its samples concatenated.

    ``token_ids`` int32 [T]; ``cu_seqlens`` int32 [k + 1], sample ``j`` is
    ``token_ids[cu_seqlens[j]:cu_seqlens[j + 1]]``; ``position_ids`` int32 [T], restarting at 0 at
    every sample; ``sample_ids`` the k ids in order.
    """

    token_ids: np.ndarray
    cu_seqlens: np.ndarray
    position_ids: np.ndarray
    sample_ids: list[str]


def pack_micro_batches(batch: Batch) -> list[PackedMicroBatch]:
    """``batch.micro_batches`` packed micro-batches, empty ones included, in order."""
    tokens, offsets, sample_ids = batch.tokens, batch.offsets, batch.sample_ids
    # Rows are ordered by micro-batch: rows[first[m]:first[m + 1]] belong to micro-batch m.
    first = np.searchsorted(batch.micro_batch, np.arange(batch.micro_batches + 1), side="left")
    # positions [total tokens]: index within its own sample.
    positions = np.arange(tokens.size, dtype=np.int64) - np.repeat(offsets[:-1], np.diff(offsets))
    packed = []
    for m in range(batch.micro_batches):
        lo, hi = int(first[m]), int(first[m + 1])
        start, stop = int(offsets[lo]), int(offsets[hi])
        packed.append(
            PackedMicroBatch(
                token_ids=tokens[start:stop],
                cu_seqlens=(offsets[lo : hi + 1] - start).astype(np.int32),
                position_ids=positions[start:stop].astype(np.int32),
                sample_ids=sample_ids[lo:hi],
            )
        )
    return packed
