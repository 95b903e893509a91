"""A static context-parallel job's micro-batch (``trainer_sink.cp_tensors``) as torchtitan's context-parallel
FlexAttention takes it: already this rank's zigzag slices, so that nothing is sharded again, with the attention
mask of local queries over the keys and values the block all-gathers. Pure: no Kafka, no process groups.

torchtitan's ``apply_cp_to_forward`` wraps each FlexAttention so that it all-gathers the keys and values of the
context-parallel group along the sequence (``flex_cp_allgather``: rank 0's tokens, then rank 1's, ...) and attends
the rank's own queries to them, under a ``BlockMask`` of ``T`` queries by ``C x T`` keys. In a static job every
rank of a block holds the same samples in the same order, ``P / C`` tokens of each (``P``: the sample's length
padded to a multiple of ``2C``; ``topics.formats.cp_slices``), so every rank knows from the samples' lengths alone
which sample and position each gathered token is: ``block_layout``. A query attends to a key of the same sample at
a position not after its own (causal by position in the sample, not by place in the sequence).

The batch, each tensor ``[1, n]``:

| key | type | meaning |
|---|---|---|
| ``input`` | int64 [1, T] | the rank's slices concatenated, then ``pad_to_multiple_of`` padding |
| ``positions`` | int64 [1, T] | each token's position in its sample (RoPE); from 0 in the padding |
| ``block_documents`` | int32 [1, C x T] | per gathered token, its sample's index in the micro-batch; -1 at padding |
| ``block_positions`` | int32 [1, C x T] | per gathered token, its position in its sample |
| ``loss_tokens`` | int64 [1] | the step's tokens that take a loss, over every rank: the loss's divisor |
| labels | int64 [1, T] | the next token in the sample where a target; ``-100`` elsewhere, at sample ends and padding |

``MixflowCPTrainer`` takes ``block_documents``, ``block_positions`` and ``loss_tokens`` out before the model's
``forward`` (``cp_block_mask`` makes the mask of them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from topics.errors import MixflowError
from topics.formats.cp_slices import zigzag_positions
from trainer_sink.tensors import MicroBatch

IGNORE_INDEX = -100  # torchtitan.components.loss.IGNORE_INDEX
PADDING_DOCUMENT = -1
BLOCK_KEYS = ("block_documents", "block_positions", "loss_tokens")
"""What the batch carries for the trainer, not the model."""


def block_layout(lengths: np.ndarray, cp_size: int, local_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """The micro-batch over its whole block, in the order the all-gather lays it out (rank 0's ``local_tokens``
    tokens, then rank 1's, ...): per token, its sample's index (``PADDING_DOCUMENT`` in the padding after the
    slices) and its position in the sample (from 0 in that padding). int32, ``cp_size * local_tokens`` each."""
    lengths = np.asarray(lengths, np.int64)
    k = lengths.size
    ranks = np.repeat(np.arange(cp_size), k)
    positions, counts = zigzag_positions(np.tile(lengths, cp_size), np.full(ranks.size, cp_size), ranks)
    held = int(counts[:k].sum())  # the same on every rank of a static block
    if held > local_tokens:
        msg = f"the slices hold {held} tokens, more than the {local_tokens} the micro-batch has room for"
        raise ValueError(msg)
    pad = local_tokens - held
    documents = np.repeat(np.tile(np.arange(k), cp_size), counts).reshape(cp_size, held)
    positions = positions.reshape(cp_size, held)
    padding = np.broadcast_to(np.arange(pad), (cp_size, pad))
    out_documents = np.concatenate([documents, np.full((cp_size, pad), PADDING_DOCUMENT)], axis=1)
    out_positions = np.concatenate([positions, padding], axis=1)
    return out_documents.reshape(-1).astype(np.int32), out_positions.reshape(-1).astype(np.int32)


def titan_cp_batch(
    micro_batch: MicroBatch,
    *,
    cp_rank: int,
    cp_size: int,
    pad_token_id: int = 0,
    pad_to_multiple_of: int = 1,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A static context-parallel job's micro-batch of this rank (``cp_rank`` of a block of ``cp_size``) as
    torchtitan's trainer takes it (see the module's docstring), padded to a multiple of ``pad_to_multiple_of``
    tokens; an empty one (a step with nothing for the block) is one padding segment of that many tokens."""
    input_ids = micro_batch["input_ids"].to(torch.int64)
    held = input_ids.numel()
    lengths = np.diff(micro_batch["cu_seqlens"].numpy()) if held else np.zeros(0, np.int64)
    local = max(pad_to_multiple_of, -(-held // pad_to_multiple_of) * pad_to_multiple_of)
    documents, positions = block_layout(lengths, cp_size, local)
    mine = slice(cp_rank * local, cp_rank * local + held)
    if not np.array_equal(positions[mine], micro_batch["position_ids"].numpy()):
        msg = (
            f"micro-batch {micro_batch['micro_batch']} of step {micro_batch['step']} does not hold slice {cp_rank} "
            f"of {cp_size} of its samples: not a static context-parallel block of {cp_size} ranks"
        )
        raise MixflowError(msg)
    pad = local - held
    tokens = torch.cat([input_ids, torch.full((pad,), pad_token_id, dtype=torch.int64)])
    labels = torch.cat([micro_batch["labels"].to(torch.int64), torch.full((pad,), IGNORE_INDEX, dtype=torch.int64)])
    batch = {
        "input": tokens.unsqueeze(0),
        "positions": torch.from_numpy(positions[cp_rank * local : (cp_rank + 1) * local].astype(np.int64))[None],
        "block_documents": torch.from_numpy(documents)[None],
        "block_positions": torch.from_numpy(positions)[None],
        "loss_tokens": torch.tensor([int(micro_batch["loss_tokens"])], dtype=torch.int64),
    }
    return batch, labels.unsqueeze(0)


def is_context_parallel(micro_batch: MicroBatch) -> bool:
    """Whether ``micro_batch`` is a context-parallel job's (its slices, with ``local_cp_size``)."""
    return "local_cp_size" in micro_batch


def check_cp_micro_batch(
    micro_batch: MicroBatch, *, topic: str, told: bool, ranks: int | None, dp_degree: int, cp_degree: int
) -> None:
    """Raise ``MixflowError`` unless ``micro_batch``, read from ``topic`` (of a step of ``ranks`` ranks) by a loader
    ``told`` its context-parallel place, is a static context-parallel job's that torchtitan's mesh of ``dp_degree``
    data-parallel x ``cp_degree`` context-parallel ranks trains as it is."""
    if not is_context_parallel(micro_batch):
        msg = (
            f"{topic} is not a context-parallel job's (its spec has no step.context_parallel): train it with "
            "torchtitan's Trainer, whose context parallelism cuts each micro-batch itself"
        )
        raise MixflowError(msg)
    mode = micro_batch["cp_mode"]
    if mode != "static":
        msg = (
            f"{topic} is a job of {mode} context parallelism, whose blocks of ranks vary per sample, and torchtitan's "
            "context-parallel groups are fixed: train it with Megatron-Core's hybrid context parallelism "
            "(MixflowDataIterator), or set the job's step.context_parallel.mode to static"
        )
        raise MixflowError(msg)
    if not told:
        msg = (
            f"{topic} holds a static context-parallel job's slices: train it with MixflowCPTrainer "
            "(trainer_sink.integrations.torchtitan_cp_trainer), which tells each rank's loader its place in the "
            "context-parallel mesh; torchtitan's Trainer would cut the slices again with its load balancer"
        )
        raise MixflowError(msg)
    size = int(micro_batch["local_cp_size"])
    if micro_batch["input_ids"].numel() and size != cp_degree:
        msg = (
            f"{topic}'s blocks are {size} ranks (the job's step.context_parallel.size), but torchtitan's "
            f"context_parallel_degree is {cp_degree}: set parallelism.context_parallel_degree={size}"
        )
        raise MixflowError(msg)
    if ranks is not None and ranks != dp_degree * cp_degree:
        msg = (
            f"{topic} holds steps for {ranks} ranks of the data x context mesh (the job's step.ranks), but "
            f"torchtitan's mesh has {dp_degree} data-parallel x {cp_degree} context-parallel ranks: give it "
            f"{ranks} / {cp_degree} data-parallel ranks"
        )
        raise MixflowError(msg)


def padded_to_max(micro_batch: MicroBatch) -> list[MicroBatch]:
    """``micro_batch`` and, after the rank's last micro-batch of its step, empty ones up to the job's
    ``max_micro_batches``: torchtitan runs as many batches every training step on every rank, and ranks of a step
    may run fewer. Each says ``micro_batches`` = ``max_micro_batches``, what torchtitan's step runs."""
    most = int(micro_batch["max_micro_batches"])
    out = [{**micro_batch, "micro_batches": most}]
    if micro_batch["micro_batch"] + 1 == micro_batch["micro_batches"]:
        empty = torch.zeros(0, dtype=torch.int32)
        for m in range(micro_batch["micro_batch"] + 1, most):
            out.append(
                {
                    **micro_batch,
                    "input_ids": empty,
                    "labels": torch.zeros(0, dtype=torch.int64),
                    "position_ids": empty,
                    "cu_seqlens": torch.zeros(1, dtype=torch.int32),
                    "cu_seqlens_padded": torch.zeros(1, dtype=torch.int32),
                    "max_seqlen": 0,
                    "sample_ids": [],
                    "micro_batch": m,
                    "micro_batches": most,
                }
            )
    return out


def block_mask_mod(documents: torch.Tensor, positions: torch.Tensor, cp_rank: int, cp_size: int) -> Callable:
    """FlexAttention's ``mask_mod`` of rank ``cp_rank``'s queries over the block's gathered keys: the same sample,
    a position not after the query's. ``documents`` and ``positions``: ``block_layout``'s, ``[1, C x T]``."""
    local = documents.shape[-1] // cp_size
    kv_document, kv_position = documents[0], positions[0]
    q_document = kv_document[cp_rank * local : (cp_rank + 1) * local]
    q_position = kv_position[cp_rank * local : (cp_rank + 1) * local]

    def same_sample_causal(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return (q_document[q] == kv_document[kv]) & (kv_position[kv] <= q_position[q])

    return same_sample_causal


def cp_block_mask(
    documents: torch.Tensor,
    positions: torch.Tensor,
    cp_rank: int,
    cp_size: int,
    *,
    create: Callable[..., BlockMask] = create_block_mask,
    **options: Any,
) -> BlockMask:
    """The ``BlockMask`` of ``block_mask_mod``: ``T`` queries by ``C x T`` keys, made by ``create`` (torchtitan's
    compiled ``create_attention_mask`` in training) with ``options`` (``BLOCK_SIZE``, ...)."""
    gathered = documents.shape[-1]
    if gathered % cp_size:
        msg = f"{gathered} gathered tokens do not split over {cp_size} ranks"
        raise ValueError(msg)
    mask_mod = block_mask_mod(documents, positions, cp_rank, cp_size)
    return create(mask_mod, 1, None, gathered // cp_size, gathered, device=documents.device, **options)
