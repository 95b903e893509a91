"""A small GPT-style decoder in plain PyTorch that trains on the sink's packed micro-batches.

The model takes one packed micro-batch (``trainer_sink.tensors``): ``input_ids`` [T] holding k samples
back to back, ``position_ids`` [T] restarting at 0 at each sample, ``cu_seqlens`` [k + 1] and
``max_seqlen``. Attention is causal *within* each sample and never crosses a sample boundary:

- on CUDA, ``torch.nn.attention.varlen.varlen_attn`` (flash attention over ``cu_seqlens``) in bf16;
  causal is ``is_causal=True`` on the releases that take it and ``window_size=(-1, 0)`` on the later
  ones (``inspect.signature`` decides);
- elsewhere, the samples are scattered into a right-padded [n, L, heads, head_dim] tensor and run
  through ``F.scaled_dot_product_attention(..., is_causal=True)``, then gathered back. With right
  padding a real token only sees positions at or before its own, all real, so the result is exact.
  Samples are grouped into power-of-two length buckets first (each padded to its bucket's longest), so
  one long sample does not pad every short one to its length.

``loss(model, micro_batch)`` is the mean cross-entropy over the labels that are not ``-100``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainer_sink.attention import causal_varlen_attn

IGNORE_INDEX = -100
MEDIA_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
"""The sink's keys of a micro-batch with images or clips that a vision-language model (``vlm.VLM``) takes."""

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""Attention of a micro-batch's queries, keys and values [T, heads, head_dim] (rotated) -> [T, heads, head_dim],
in place of ``packed_causal_attention`` (a context-parallel trainer's attention over a block's slices)."""


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 8192
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    mlp_ratio: int = 4
    positions: str = "rope"  # "rope" (rotary, from position_ids) or "learned" (an embedding table)
    max_positions: int = 8192  # learned positions only: position_ids must stay below this
    rope_base: float = 10_000.0
    attention: str = "auto"  # "auto" (varlen on CUDA, padded SDPA elsewhere), "varlen" or "sdpa"

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            msg = f"d_model {self.d_model} must split into {self.n_heads} heads of an even size"
            raise ValueError(msg)
        if self.positions not in ("rope", "learned"):
            msg = f"positions must be 'rope' or 'learned', not {self.positions!r}"
            raise ValueError(msg)
        if self.attention not in ("auto", "varlen", "sdpa"):
            msg = f"attention must be 'auto', 'varlen' or 'sdpa', not {self.attention!r}"
            raise ValueError(msg)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--vocab-size``, ``--d-model``, ... flags of ``GPTConfig``; the defaults are tiny (CPU)."""
    group = parser.add_argument_group("model")
    defaults = GPTConfig()
    group.add_argument(
        "--vocab-size",
        type=int,
        default=defaults.vocab_size,
        help="token ids must be below this (the tokenizer's vocabulary size or more)",
    )
    group.add_argument("--d-model", type=int, default=defaults.d_model)
    group.add_argument("--layers", type=int, default=defaults.n_layers)
    group.add_argument("--heads", type=int, default=defaults.n_heads)
    group.add_argument("--mlp-ratio", type=int, default=defaults.mlp_ratio)
    group.add_argument("--positions", choices=("rope", "learned"), default=defaults.positions)
    group.add_argument(
        "--max-positions",
        type=int,
        default=defaults.max_positions,
        help="learned positions only: the longest sample the model takes",
    )
    group.add_argument(
        "--attention",
        choices=("auto", "varlen", "sdpa"),
        default=defaults.attention,
        help="auto: varlen_attn on CUDA, padded scaled_dot_product_attention elsewhere",
    )


def config_from_arguments(args: argparse.Namespace) -> GPTConfig:
    return GPTConfig(
        vocab_size=args.vocab_size,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
        mlp_ratio=args.mlp_ratio,
        positions=args.positions,
        max_positions=args.max_positions,
        attention=args.attention,
    )


# -- attention over packed samples ----------------------------------------------------------------------


def varlen_available() -> bool:
    return causal_varlen_attn() is not None


def _varlen_causal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int
) -> torch.Tensor:
    found = causal_varlen_attn()
    if found is None:
        msg = f"torch {torch.__version__} has no causal torch.nn.attention.varlen.varlen_attn; use --attention sdpa"
        raise RuntimeError(msg)
    varlen_attn, causal = found
    dtype = q.dtype if q.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
    out = varlen_attn(q.to(dtype), k.to(dtype), v.to(dtype), cu, cu, max_seqlen, max_seqlen, **causal)
    return out.to(q.dtype)


def _length_buckets(cu_seqlens: torch.Tensor) -> list[tuple[np.ndarray, np.ndarray, int, int]]:
    """Samples grouped by the power of two their length rounds up to: per bucket, the token indices
    of its samples in the packed tensor, where each lands in the padded [n * L] rows, n and L."""
    bounds = cu_seqlens.detach().cpu().numpy().astype(np.int64)
    starts, lengths = bounds[:-1], np.diff(bounds)
    buckets = []
    keys = np.where(lengths > 0, np.ceil(np.log2(np.maximum(lengths, 1))), -1).astype(np.int64)
    for key in np.unique(keys[keys >= 0]):
        members = np.flatnonzero(keys == key)
        n, width = members.size, int(lengths[members].max())
        member_lengths = lengths[members]
        within = np.arange(int(member_lengths.sum())) - np.repeat(
            np.cumsum(member_lengths) - member_lengths, member_lengths
        )
        tokens = np.repeat(starts[members], member_lengths) + within
        rows = np.repeat(np.arange(n) * width, member_lengths) + within
        buckets.append((tokens, rows, n, width))
    return buckets


def _padded_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    _, heads, head_dim = q.shape
    out = torch.zeros_like(q)
    for tokens_np, rows_np, n, width in _length_buckets(cu_seqlens):
        tokens = torch.from_numpy(tokens_np).to(q.device)
        rows = torch.from_numpy(rows_np).to(q.device)

        def padded(
            x: torch.Tensor, tokens: torch.Tensor = tokens, rows: torch.Tensor = rows, n: int = n, width: int = width
        ) -> torch.Tensor:
            buffer = x.new_zeros(n * width, heads, head_dim).index_copy(0, rows, x.index_select(0, tokens))
            return buffer.view(n, width, heads, head_dim).transpose(1, 2)  # [n, heads, L, head_dim]

        attended = F.scaled_dot_product_attention(padded(q), padded(k), padded(v), is_causal=True)
        attended = attended.transpose(1, 2).reshape(n * width, heads, head_dim).index_select(0, rows)
        out = out.index_copy(0, tokens, attended)
    return out


def packed_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    backend: str = "auto",
) -> torch.Tensor:
    """Causal attention within each sample of a packed sequence. ``q``, ``k``, ``v``: [T, heads,
    head_dim]; sample ``j`` is rows ``cu_seqlens[j]:cu_seqlens[j + 1]``. Returns [T, heads, head_dim]."""
    if q.shape[0] == 0:
        # An empty micro-batch: keep every projection in the graph so DDP sees a gradient for each.
        return q * 0 + k * 0 + v * 0
    if backend == "varlen" or (backend == "auto" and q.is_cuda and varlen_available()):
        return _varlen_causal(q, k, v, cu_seqlens, max_seqlen)
    return _padded_causal(q, k, v, cu_seqlens)


# -- the model ------------------------------------------------------------------------------------------


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half form) of ``x`` [T, heads, head_dim] by angles [T, 1, head_dim / 2]."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        d = config.d_model
        self.heads = config.n_heads
        self.attention = config.attention
        self.attn_norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.mlp_norm = nn.LayerNorm(d)
        self.mlp_in = nn.Linear(d, config.mlp_ratio * d, bias=False)
        self.mlp_out = nn.Linear(config.mlp_ratio * d, d, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor] | None,
        cu_seqlens: torch.Tensor,
        max_seqlen: int,
        attend: Attend | None = None,
    ) -> torch.Tensor:
        total, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(total, 3, self.heads, d // self.heads).unbind(1)
        if rotary is not None:
            q, k = _rotate(q, *rotary), _rotate(k, *rotary)
        if attend is not None:
            attended = attend(q, k, v)
        else:
            attended = packed_causal_attention(q, k, v, cu_seqlens, max_seqlen, self.attention)
        x = x + self.attn_out(attended.reshape(total, d))
        return x + self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(x))))


class GPT(nn.Module):
    """Decoder-only transformer over one packed micro-batch; the LM head is the token embedding."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embed = (
            nn.Embedding(config.max_positions, config.d_model) if config.positions == "learned" else None
        )
        head_dim = config.d_model // config.n_heads
        inv_freq = config.rope_base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.final_norm = nn.LayerNorm(config.d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for name, parameter in self.named_parameters():
            if parameter.dim() < 2:
                continue  # norms keep their ones and zeros
            std = 0.02
            if name.endswith(("attn_out.weight", "mlp_out.weight")):
                std /= math.sqrt(2 * self.config.n_layers)  # residual branches (GPT-2)
            nn.init.normal_(parameter, std=std)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        max_seqlen: int,
        inputs_embeds: torch.Tensor | None = None,
        attend: Attend | None = None,
    ) -> torch.Tensor:
        """Logits [T, vocab] of a packed micro-batch; ``inputs_embeds`` in place of the token embeddings (a
        vision-language model puts its image embeddings there); ``attend`` in place of the causal attention
        within each sample of ``cu_seqlens``."""
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        rotary = None
        if self.position_embed is not None:
            x = x + self.position_embed(position_ids)
        else:
            angles = position_ids.float()[:, None] * self.inv_freq[None, :]
            rotary = (angles.cos()[:, None, :], angles.sin()[:, None, :])
        for block in self.blocks:
            x = block(x, rotary, cu_seqlens, max_seqlen, attend)
        return F.linear(self.final_norm(x), self.embed.weight)


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def loss_sum(model: nn.Module, micro_batch: Mapping[str, Any]) -> tuple[torch.Tensor, int]:
    """The summed cross-entropy over the labels that are not ``-100``, and how many there are. ``model``
    may be wrapped (DDP); tensors not on its device are moved there."""
    device = _device_of(model)
    tensors = {
        key: micro_batch[key].to(device, non_blocking=True)
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens")
    }
    media = {key: micro_batch[key].to(device, non_blocking=True) for key in MEDIA_KEYS if key in micro_batch}
    logits = model(
        input_ids=tensors["input_ids"],
        position_ids=tensors["position_ids"],
        cu_seqlens=tensors["cu_seqlens"],
        max_seqlen=int(micro_batch["max_seqlen"]),
        **media,
    )
    total = F.cross_entropy(logits.float(), tensors["labels"], ignore_index=IGNORE_INDEX, reduction="sum")
    return total, label_count(micro_batch)


def loss(model: nn.Module, micro_batch: Mapping[str, Any]) -> torch.Tensor:
    """The mean cross-entropy over the labels that are not ``-100`` (0, still in the graph, when none)."""
    total, count = loss_sum(model, micro_batch)
    return total / max(count, 1)


def label_count(micro_batch: Mapping[str, Any]) -> int:
    """The labels that are not ``-100``. Counted on the labels when they are in host memory; on a
    device (where reading them would wait for the device) it is the tokens less the non-empty samples,
    as every sample's last token has no label, less the sink's padding segment if any (all ``-100``)."""
    labels = micro_batch["labels"]
    if labels.device.type == "cpu":
        return int((labels != IGNORE_INDEX).sum())
    padding = int(micro_batch.get("padding_tokens", 0))
    samples = int(micro_batch["cu_seqlens"].numel()) - 1 - (1 if padding else 0)
    return int(micro_batch["input_ids"].numel()) - padding - samples


def describe(model: nn.Module) -> str:
    """The model's GPT config and parameter count (a VLM's vision tower included)."""
    parameters = sum(p.numel() for p in model.parameters())
    kind = "GPT" if isinstance(model, GPT) else f"{type(model).__name__} over a GPT"
    return f"{kind} {asdict(model.config)}: {parameters / 1e6:.2f} M parameters"
