"""Attention over a context-parallel block's slices, for ``examples/train_long_context.py``.

A micro-batch of a context-parallel job (``trainer_sink.cp_tensors``) holds, of each of its ``k`` samples, this
rank's zigzag slice (``topics/formats/cp_slices.py``): ``position_ids`` are the tokens' positions in their
samples, ``cu_seqlens`` the samples' whole lengths, ``cu_seqlens_padded / local_cp_size`` the slices' sizes. Its
block is ``local_cp_size`` (``c``) consecutive ranks starting at ``rank - cp_rank``, and each of them holds the
other slices of the same samples, in the same order, at the same micro-batch index of the step.

Each rank computes the queries, keys and values of its own tokens; for ``c > 1`` it all-gathers the block's keys
and values (``gather_block``, whose backward sums the block's gradients for this rank's keys and values) and each
query attends to the keys of its own sample at or before its position, padding left out. ``c == 1`` is the same
attention over the rank's own keys, with no collective.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from topics.formats.cp_slices import zigzag_positions

Block = tuple[int, int]
"""(first rank, ranks) of a block."""


def block_layouts(mode: str, size: int, world: int) -> list[Block]:
    """Every block of more than one rank a step of ``mode`` may use on ``world`` ranks, in one fixed order:
    ``static``, ``size`` ranks at multiples of ``size``; ``aligned``, each power of two up to ``size`` at its
    multiples; ``free``, any ``2 .. size`` consecutive ranks."""
    if mode == "static":
        sizes = [size] if size > 1 else []
    elif mode == "aligned":
        sizes = [1 << e for e in range(1, size.bit_length()) if 1 << e <= size]
    elif mode == "free":
        sizes = list(range(2, size + 1))
    else:
        msg = f"unknown context-parallel mode {mode!r} (static, aligned or free)"
        raise ValueError(msg)
    return [(first, c) for c in sizes for first in range(0, world - c + 1, 1 if mode == "free" else c)]


class BlockGroups:
    """A process group per block of the job's mode, made once. ``dist.new_group`` is collective over every rank,
    so every rank makes every group, in the same order (``block_layouts``'), its own blocks or not."""

    def __init__(self, mode: str, size: int, world: int) -> None:
        self.groups = {
            (first, c): dist.new_group(list(range(first, first + c))) for first, c in block_layouts(mode, size, world)
        }

    def of(self, rank: int, micro_batch: Mapping[str, Any]) -> dist.ProcessGroup | None:
        """The group of the block that runs ``micro_batch`` with this rank; None for one rank alone."""
        c, place = int(micro_batch["local_cp_size"]), int(micro_batch["cp_rank"])
        if c == 1:
            return None
        block = (rank - place, c)
        if block not in self.groups:
            msg = f"step {micro_batch['step']}: rank {rank} is place {place} of a block of {c}, not one of the mode's"
            raise RuntimeError(msg)
        return self.groups[block]


class _GatherBlock(torch.autograd.Function):
    """All-gather along dim 0 over a block's group. Backward: this rank's rows of the gradient summed over the
    block (all-reduce, then this rank's chunk). ``torch.distributed.nn.functional.all_gather`` does the same on
    NCCL, but its gloo backward scatters from group ranks given as global ranks, which fails for a block
    without global rank 0."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group, ctx.place, ctx.ranks = group, dist.get_rank(group), dist.get_world_size(group)
        parts = [torch.empty_like(x) for _ in range(ctx.ranks)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        summed = grad.contiguous().clone()
        dist.all_reduce(summed, group=ctx.group)
        return summed.chunk(ctx.ranks)[ctx.place], None


def gather_block(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``x`` [n, ...] of every rank of ``group``, rank by rank: [ranks * n, ...]; gradients flow back to each."""
    return _GatherBlock.apply(x, group)


def key_layout(lengths: np.ndarray, ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """The position in its sample and the sample's index (in the micro-batch) of each key a block of ``ranks``
    gathers for samples of ``lengths``: rank by rank of the block, each rank's slices sample by sample."""
    k = lengths.size
    positions, counts = zigzag_positions(
        np.tile(lengths, ranks), np.full(k * ranks, ranks), np.repeat(np.arange(ranks), k)
    )
    return positions, np.repeat(np.tile(np.arange(k), ranks), counts)


class BlockAttention:
    """``gpt.Attend`` for one micro-batch: causal attention within each sample over the slices of its block."""

    def __init__(self, micro_batch: Mapping[str, Any], group: dist.ProcessGroup | None) -> None:
        ranks = int(micro_batch["local_cp_size"])
        lengths = torch.diff(micro_batch["cu_seqlens"]).numpy().astype(np.int64)
        slices = torch.diff(micro_batch["cu_seqlens_padded"]).numpy().astype(np.int64) // ranks
        key_positions, key_samples = key_layout(lengths, ranks)
        query_positions = micro_batch["position_ids"].numpy().astype(np.int64)
        query_samples = np.repeat(np.arange(lengths.size), slices)
        allowed = (
            (key_samples[None, :] == query_samples[:, None])
            & (key_positions[None, :] <= query_positions[:, None])
            & (key_positions < lengths[key_samples])[None, :]  # a padding key is no token
        )
        self.mask = torch.from_numpy(allowed)  # [T, ranks * T]; a padding query still sees its sample's tokens
        self.group = group

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.shape[0] == 0:
            return q * 0 + k * 0 + v * 0  # a rank's empty micro-batch
        if self.group is not None:
            k, v = gather_block(torch.stack((k, v)).transpose(0, 1), self.group).transpose(0, 1).unbind(0)
        # [T, heads, head_dim] -> [heads, T, head_dim]; the mask broadcasts over the heads.
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=self.mask
        )
        return out.transpose(0, 1)
