"""One micro-batch of the sink as Megatron's GPT training step reads it. Pure: no Kafka, no process groups.

The dict is what Megatron-LM's ``get_batch_on_this_tp_rank`` takes from the data iterator and what its
packed-sequence (SFT) datasets give: ``tokens``, ``labels`` (int64 ``[1, T]``), ``loss_mask`` (float32
``[1, T]``), ``position_ids`` (int64 ``[1, T]``), ``cu_seqlens`` (int32 ``[1, k + 1]``) and ``max_seqlen``
(int32 ``[1]``); ``packed_seq_params``, Megatron-Core's ``PackedSeqParams`` in THD layout over the same
boundaries; ``attention_mask`` only when asked for (bool ``[1, 1, T, T]``, ``True`` where a query may not
attend, Megatron's convention), for attention without THD support (Megatron-Core's local
``DotProductAttention``); absent otherwise, which ``get_batch_on_this_tp_rank`` reads as ``None``.

Labels are the next token of the same sample; where there is none (a sample's last token, padding) or it
is not a target of the loss (a conversation's user turn) the label is ``pad_token_id`` and ``loss_mask`` is 0,
as in Megatron's datasets (its vocab-parallel cross entropy takes no ignore index).

Padding, as Megatron's SFT dataset lays it out: with ``context_parallel`` ``cp > 1`` each sample is padded to
a multiple of ``2 * cp`` tokens (positions go on counting, no loss), which Megatron-Core's THD split over
context-parallel ranks needs; ``seq_length`` pads the micro-batch to exactly that many tokens (a fixed
shape: Megatron-LM's tensor-parallel broadcast allocates ``[micro_batch_size, seq_length]`` on the
receiving ranks) and ``pad_to_multiple_of`` to a multiple, both with one padding segment at the end. An
empty micro-batch is one padding segment without loss."""

from __future__ import annotations

import math
from typing import Any

import torch
from megatron.core.packed_seq_params import PackedSeqParams

from topics.errors import MixflowError
from trainer_sink.tensors import MicroBatch

IGNORE_INDEX = -100  # the sink's label where there is no next token


def megatron_batch(
    micro_batch: MicroBatch,
    *,
    pad_token_id: int = 0,
    context_parallel: int = 1,
    seq_length: int | None = None,
    pad_to_multiple_of: int = 1,
    attention_mask: bool = False,
) -> dict[str, Any]:
    """The sink's packed ``micro_batch`` (``trainer_sink.tensors``, without its own padding) as Megatron reads
    it (see the module's docstring)."""
    unit = 2 * context_parallel if context_parallel > 1 else 1
    tokens, labels, positions, bounds = _sample_padded(micro_batch, unit, pad_token_id)
    total = int(bounds[-1])
    target = _padded_length(total, unit, seq_length, pad_to_multiple_of)
    if target > total:
        extra = target - total
        tokens = torch.cat([tokens, torch.full((extra,), pad_token_id, dtype=torch.int64, device=tokens.device)])
        labels = torch.cat([labels, torch.full((extra,), IGNORE_INDEX, dtype=torch.int64, device=labels.device)])
        positions = torch.cat([positions, torch.arange(extra, dtype=torch.int64, device=positions.device)])
        bounds = torch.cat([bounds, bounds.new_tensor([target])])
    loss_mask = (labels != IGNORE_INDEX).to(torch.float32)
    labels = torch.where(labels == IGNORE_INDEX, torch.full_like(labels, pad_token_id), labels)
    longest = int(bounds.diff().max())
    batch: dict[str, Any] = {
        "tokens": tokens.unsqueeze(0),
        "labels": labels.unsqueeze(0),
        "loss_mask": loss_mask.unsqueeze(0),
        "position_ids": positions.unsqueeze(0),
        "cu_seqlens": bounds.unsqueeze(0),
        "max_seqlen": torch.tensor([longest], dtype=torch.int32, device=bounds.device),
        "packed_seq_params": packed_seq_params(bounds, longest),
    }
    if attention_mask:
        batch["attention_mask"] = masked_out(bounds)[None, None]
    return batch


def packed_seq_params(cu_seqlens: torch.Tensor, max_seqlen: int) -> PackedSeqParams:
    """Megatron-Core's THD parameters for self-attention over the samples ``cu_seqlens`` (int32 ``[k + 1]``)
    bounds; the bounds include each sample's padding, so the padded bounds are the same."""
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_kv=cu_seqlens,
        cu_seqlens_q_padded=cu_seqlens,
        cu_seqlens_kv_padded=cu_seqlens,
        max_seqlen_q=max_seqlen,
        max_seqlen_kv=max_seqlen,
    )


def masked_out(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """bool ``[T, T]``: ``True`` where query ``i`` may not attend key ``j`` (another segment, or ``j > i``)."""
    segment = torch.repeat_interleave(
        torch.arange(cu_seqlens.numel() - 1, device=cu_seqlens.device), cu_seqlens.diff().long()
    )
    same = segment[:, None] == segment[None, :]
    causal = torch.ones(same.shape, dtype=torch.bool, device=same.device).tril_()
    return ~(same & causal)


def _sample_padded(
    micro_batch: MicroBatch, unit: int, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens, labels, positions (int64) and bounds (int32) with each sample padded to a multiple of ``unit``."""
    if micro_batch.get("padding_tokens"):
        msg = "megatron_batch pads by itself: read the sink with pad_to_multiple_of=1"
        raise MixflowError(msg)
    tokens = micro_batch["input_ids"].to(torch.int64)
    labels = micro_batch["labels"].to(torch.int64)
    positions = micro_batch["position_ids"].to(torch.int64)
    bounds = micro_batch["cu_seqlens"].to(torch.int32)
    if unit == 1 or tokens.numel() == 0:
        return tokens, labels, positions, bounds
    lengths = bounds.diff().long()
    padded = (lengths + unit - 1) // unit * unit
    new_bounds = torch.cat([bounds.new_zeros(1), padded.cumsum(0).to(torch.int32)])
    samples = torch.arange(lengths.numel(), device=tokens.device)
    segment = torch.repeat_interleave(samples, lengths)
    where = new_bounds[segment].long() + torch.arange(tokens.numel(), device=tokens.device) - bounds[segment].long()
    total = int(new_bounds[-1])
    out_tokens = torch.full((total,), pad_token_id, dtype=torch.int64, device=tokens.device)
    out_labels = torch.full((total,), IGNORE_INDEX, dtype=torch.int64, device=tokens.device)
    out_tokens[where] = tokens
    out_labels[where] = labels
    padded_segment = torch.repeat_interleave(samples, padded)
    out_positions = torch.arange(total, device=tokens.device) - new_bounds[padded_segment].long()
    return out_tokens, out_labels, out_positions, new_bounds


def _padded_length(total: int, unit: int, seq_length: int | None, multiple: int) -> int:
    """The micro-batch's length in tokens: ``seq_length``, or ``total`` rounded up (an empty one: one unit)."""
    if seq_length is not None:
        if total > seq_length:
            msg = (
                f"a micro-batch of {total} tokens (samples padded for context parallelism included) does not fit "
                f"seq_length {seq_length}: set --seq-length to at least the job's micro-batch capacity"
            )
            raise MixflowError(msg)
        if seq_length % unit:
            msg = f"seq_length {seq_length} is not a multiple of 2 x context-parallel size ({unit})"
            raise MixflowError(msg)
        return seq_length
    step = math.lcm(multiple, unit)
    return max(-(-total // step) * step, step)
