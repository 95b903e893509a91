"""One transformer block as the trainer runs it: samples packed into one sequence, attention within each.

The LLM's block attends causally within each sample; the vision encoder's (a ViT block, ``causal=False``)
attends to every patch of its own image or clip, the items of a micro-batch packed the same way."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer_sink.attention import causal_varlen_attn

VARLEN = "varlen"
SDPA = "sdpa"


def varlen_attention(causal: bool) -> tuple[Callable[..., torch.Tensor], dict[str, Any]] | None:
    """torch's ``varlen_attn`` and the keyword arguments that make it causal, or full within each sequence;
    ``None`` when this torch has none that takes either spelling."""
    found = causal_varlen_attn()
    if found is None or causal:
        return found
    varlen_attn, causal_arguments = found
    if "is_causal" in causal_arguments:
        return varlen_attn, {"is_causal": False}
    return varlen_attn, {"window_size": (-1, -1)}  # (left, right): everything before and after


def attention_backend(device: torch.device, dtype: torch.dtype, causal: bool = True) -> str:
    """``varlen`` (flash attention over ``cu_seqlens``) on CUDA in 16 bits where this torch has it, as the
    trainer runs packed samples; else ``sdpa`` (``scaled_dot_product_attention``, samples as a batch)."""
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and varlen_attention(causal) is not None:
        return VARLEN
    return SDPA


class Block(nn.Module):
    """Pre-norm attention (QKV and output projections) and a GELU MLP of width ``mlp`` (default 4x), no
    biases; ``causal``: attention within each sample causal (the LLM), else full (the vision encoder)."""

    def __init__(self, hidden: int, heads: int, attention: str, *, mlp: int | None = None, causal: bool = True) -> None:
        super().__init__()
        if hidden % heads:
            msg = f"hidden {hidden} is not a multiple of heads {heads}"
            raise ValueError(msg)
        if attention not in (VARLEN, SDPA):
            msg = f"attention must be {VARLEN!r} or {SDPA!r}, got {attention!r}"
            raise ValueError(msg)
        if attention == VARLEN and varlen_attention(causal) is None:
            how = "causal" if causal else "full"
            msg = f"torch {torch.__version__} has no {how} torch.nn.attention.varlen.varlen_attn"
            raise ValueError(msg)
        width = 4 * hidden if mlp is None else mlp
        self.hidden, self.heads, self.attention, self.mlp, self.causal = hidden, heads, attention, width, causal
        self.norm1, self.norm2 = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden, bias=False), nn.Linear(hidden, hidden, bias=False)
        self.up, self.down = nn.Linear(hidden, width, bias=False), nn.Linear(width, hidden, bias=False)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
        """``x``: [tokens, hidden], samples bounded by ``cu_seqlens`` (int32), the longest of ``length`` tokens."""
        q, k, v = self.qkv(self.norm1(x)).view(-1, 3, self.heads, self.hidden // self.heads).unbind(1)
        x = x + self.proj(self._attend(q, k, v, cu_seqlens, length).reshape(-1, self.hidden))
        return x + self.down(F.gelu(self.up(self.norm2(x))))

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, length: int
    ) -> torch.Tensor:
        if self.attention == VARLEN:
            found = varlen_attention(self.causal)
            assert found is not None  # checked in __init__
            varlen_attn, how = found
            return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, length, length, **how)
        tokens, heads, head_dim = q.shape
        if tokens == length * (len(cu_seqlens) - 1):  # samples of one length: one batched call

            def batched(t: torch.Tensor) -> torch.Tensor:  # [samples, heads, length, head_dim]
                return t.view(tokens // length, length, heads, head_dim).transpose(1, 2)

            out = F.scaled_dot_product_attention(batched(q), batched(k), batched(v), is_causal=self.causal)
            return out.transpose(1, 2).reshape(tokens, heads, head_dim)
        bounds = cu_seqlens.tolist()
        return torch.cat(
            [
                F.scaled_dot_product_attention(
                    *(t[a:b].transpose(0, 1) for t in (q, k, v)), is_causal=self.causal
                ).transpose(0, 1)
                for a, b in itertools.pairwise(bounds)
            ]
        )
