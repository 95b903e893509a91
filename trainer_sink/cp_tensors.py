"""One micro-batch of a context-parallel batch (format version 3) as the dict of tensors a training step takes:
this rank's slices, laid out as Megatron-Core's packed sequences take them under context parallelism. Pure.

| key | type | meaning |
|---|---|---|
| ``input_ids`` | int32 [T] | the slices' tokens, concatenated (padding included); read-only |
| ``labels`` | int64 [T] | the next token in its sample where a target; ``-100`` elsewhere, at sample ends and padding |
| ``position_ids`` | int32 [T] | each slice token's position in its sample |
| ``cu_seqlens`` | int32 [k + 1] | ``0`` then the running sum of the k samples' whole lengths |
| ``cu_seqlens_padded`` | int32 [k + 1] | the same of their lengths padded to ``2 * local_cp_size`` |
| ``max_seqlen`` | int | the longest padded sample |
| ``local_cp_size``, ``cp_rank`` | int | the ranks of the micro-batch's block, and this rank's place in it |
| ``loss_tokens`` | int | the step's tokens that take a loss, over every rank: the per-token loss's divisor |
| ``max_micro_batches`` | int | the most micro-batches a rank of the job runs in a step |
| ``cp_mode`` | str | the job's context-parallel mode: ``static``, ``aligned`` or ``free`` |
| ``step``, ``micro_batch``, ``micro_batches``, ``rank`` | int | where this micro-batch belongs |
| ``sample_ids`` | list[str] | the k sample ids |

A rank with no micro-batch in a step gets one empty micro-batch (``T = 0``, ``local_cp_size`` 1), so that it
still sees the step and takes part in its optimizer step.
"""

from __future__ import annotations

import torch

from topics.formats.cp_batch import CPBatch
from topics.formats.cp_packing import pack_cp_micro_batches
from trainer_sink.tensors import MicroBatch


def cp_micro_batch_tensors(batch: CPBatch) -> list[MicroBatch]:
    """The rank's micro-batches of ``batch`` in the order it runs them (one empty one where it has none)."""
    packed = pack_cp_micro_batches(batch)
    count = max(1, len(packed))
    out: list[MicroBatch] = []
    for m, micro in enumerate(packed):
        out.append(
            {
                "input_ids": torch.from_numpy(micro.token_ids),
                "labels": torch.from_numpy(micro.labels),
                "position_ids": torch.from_numpy(micro.position_ids),
                "cu_seqlens": torch.from_numpy(micro.cu_seqlens),
                "cu_seqlens_padded": torch.from_numpy(micro.cu_seqlens_padded),
                "max_seqlen": micro.max_seqlen,
                "local_cp_size": micro.local_cp_size,
                "cp_rank": micro.cp_rank,
                "sample_ids": micro.sample_ids,
                **_where(batch, m, count),
            }
        )
    if not out:
        empty = torch.zeros(0, dtype=torch.int32)
        out.append(
            {
                "input_ids": empty,
                "labels": torch.zeros(0, dtype=torch.int64),
                "position_ids": empty.clone(),
                "cu_seqlens": torch.zeros(1, dtype=torch.int32),
                "cu_seqlens_padded": torch.zeros(1, dtype=torch.int32),
                "max_seqlen": 0,
                "local_cp_size": 1,
                "cp_rank": 0,
                "sample_ids": [],
                **_where(batch, 0, 1),
            }
        )
    return out


def _where(batch: CPBatch, micro_batch: int, count: int) -> dict[str, int | str]:
    return {
        "loss_tokens": batch.loss_tokens,
        "max_micro_batches": batch.max_micro_batches,
        "cp_mode": batch.mode,
        "padding_tokens": 0,
        "step": batch.step,
        "micro_batch": micro_batch,
        "micro_batches": count,
        "rank": batch.rank,
    }


def delivered_micro_batches(batch: CPBatch) -> int:
    """How many micro-batches the sink hands over for ``batch``: its count, or the one empty one."""
    return max(1, batch.micro_batches)
