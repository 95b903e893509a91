"""A context-parallel job's micro-batch (``trainer_sink.cp_tensors``) as Megatron-Core's packed-sequence path
takes it under hybrid context parallelism (``--hybrid-context-parallel``): already this rank's zigzag slices, so
that neither ``get_thd_batch_on_this_cp_rank`` nor ``HybridCPDataLoaderWrapper``'s all-gather and ``all_to_all``
run. Pure: no Kafka, no process groups.

The dict: ``tokens``, ``labels`` (int64 ``[1, T]``; ``pad_token_id`` where there is no next token, with
``loss_mask`` 0 there, float32 ``[1, T]``), ``position_ids`` (int64 ``[1, T]``, each token's position in its
sample), ``cu_seqlens`` and ``cu_seqlens_padded`` (int32 ``[1, k + 1]``: the samples whole, and padded to
``2 * local_cp_size``), ``max_seqlen`` (int32 ``[1]``, the longest padded), ``local_cp_size`` (int: the ranks of
this micro-batch's block), ``loss_tokens`` (the step's tokens with a loss, over every rank: with
``--calculate-per-token-loss`` the divisor of the summed loss) and ``packed_seq_params``, Megatron-Core's
``PackedSeqParams`` in THD layout with both kinds of bounds and ``local_cp_size``; the caller sets its
``cp_group`` to the block's group."""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.packed_seq_params import PackedSeqParams

from topics.errors import MixflowError
from trainer_sink.tensors import MicroBatch

IGNORE_INDEX = -100


def is_context_parallel(micro_batch: MicroBatch) -> bool:
    """Whether ``micro_batch`` is a context-parallel job's (its slices, with ``local_cp_size``)."""
    return "local_cp_size" in micro_batch


def megatron_cp_batch(micro_batch: MicroBatch, *, pad_token_id: int = 0) -> dict[str, Any]:
    """``micro_batch`` of a context-parallel job as Megatron-Core takes it (see the module's docstring)."""
    if not is_context_parallel(micro_batch):
        msg = "megatron_cp_batch takes a context-parallel job's micro-batch (one with local_cp_size)"
        raise MixflowError(msg)
    labels = micro_batch["labels"].to(torch.int64)
    loss_mask = (labels != IGNORE_INDEX).to(torch.float32)
    labels = torch.where(labels == IGNORE_INDEX, torch.full_like(labels, pad_token_id), labels)
    cu_seqlens = micro_batch["cu_seqlens"].to(torch.int32)
    cu_seqlens_padded = micro_batch["cu_seqlens_padded"].to(torch.int32)
    longest = int(micro_batch["max_seqlen"])
    local_cp_size = int(micro_batch["local_cp_size"])
    return {
        "tokens": micro_batch["input_ids"].to(torch.int64).unsqueeze(0),
        "labels": labels.unsqueeze(0),
        "loss_mask": loss_mask.unsqueeze(0),
        "position_ids": micro_batch["position_ids"].to(torch.int64).unsqueeze(0),
        "cu_seqlens": cu_seqlens.unsqueeze(0),
        "cu_seqlens_padded": cu_seqlens_padded.unsqueeze(0),
        "max_seqlen": torch.tensor([longest], dtype=torch.int32),
        "local_cp_size": local_cp_size,
        "loss_tokens": int(micro_batch["loss_tokens"]),
        "packed_seq_params": PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=cu_seqlens,
            cu_seqlens_kv=cu_seqlens,
            cu_seqlens_q_padded=cu_seqlens_padded,
            cu_seqlens_kv_padded=cu_seqlens_padded,
            max_seqlen_q=longest,
            max_seqlen_kv=longest,
            local_cp_size=local_cp_size,
        ),
    }
