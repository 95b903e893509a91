"""One transformer block as a rank of a context-parallel block runs it, and its timer (``gpu_cp_check``).

A rank's micro-batch holds samples whole (a block of 1) and zigzag slices of samples split over ``c`` ranks
(``topics.formats.cp_slices``: chunks ``r`` and ``2c - 1 - r`` of the sample padded to ``P``). Its queries,
keys and values are projected from its own tokens only; a slice's chunk attends causally to itself and in full
to every key of the sample before it, the others' keys and values taken from a buffer that stands for what the
ring (or all-gather) delivered: the attention ring context parallelism computes on the rank, block by block,
the two parts added where it merges them by their log-sum-exp (an elementwise step of no weight here)."""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.tools.calibrate.block import varlen_attention
from topics.formats.cp_slices import zigzag_positions


@dataclass(frozen=True)
class Sequences:
    """Query and key sequences of one varlen attention call."""

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int


@dataclass(frozen=True)
class Layout:
    """Where a rank's tokens sit: ``causal``, each chunk (or whole sample) against itself; ``full``, the chunks
    past a sample's start (``full_rows``) against the keys before them (``full_keys``, into ``received``, the
    sample's whole keys, of which the rank's own rows ``own_rows`` sit at ``own_positions``)."""

    tokens: int
    causal: Sequences
    full: Sequences | None
    full_rows: torch.Tensor
    full_keys: torch.Tensor
    own_rows: torch.Tensor
    own_positions: torch.Tensor
    received: int


def layout_of(samples: list[tuple[int, int, int]], device: torch.device) -> Layout:
    """The layout of a micro-batch of ``samples``: (length, block size, the rank's place in the block)."""
    length, cp, place = (np.array([s[i] for s in samples], np.int64) for i in range(3))
    positions, counts = zigzag_positions(length, cp, place)
    starts = np.cumsum(counts) - counts
    padded = counts * cp
    split = cp > 1
    offsets = np.cumsum(np.where(split, padded, 0)) - np.where(split, padded, 0)
    causal, full_q, full_k, full_rows, full_keys, own_rows, own_positions = [], [], [], [], [], [], []
    for i in range(length.size):
        if not split[i]:
            causal.append(int(length[i]))
            continue
        chunk = int(counts[i] // 2)
        rows = np.arange(starts[i], starts[i] + counts[i])
        own_rows.append(rows)
        own_positions.append(offsets[i] + positions[starts[i] : starts[i] + counts[i]])
        for half in (0, 1):
            first = int(positions[starts[i] + half * chunk])  # where the chunk starts in the sample
            causal.append(chunk)
            if first:
                full_q.append(chunk)
                full_k.append(first)
                full_rows.append(rows[half * chunk : (half + 1) * chunk])
                full_keys.append(offsets[i] + np.arange(first))

    def sequences(q: list[int], k: list[int]) -> Sequences:
        def cu(n: list[int]) -> torch.Tensor:
            return torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32, device=device)

        return Sequences(cu(q), cu(k), max(q), max(k))

    def index(parts: list[np.ndarray]) -> torch.Tensor:
        joined = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return torch.as_tensor(joined, dtype=torch.int64, device=device)

    return Layout(
        tokens=int(counts.sum()),
        causal=sequences(causal, causal),
        full=sequences(full_q, full_k) if full_q else None,
        full_rows=index(full_rows),
        full_keys=index(full_keys),
        own_rows=index(own_rows),
        own_positions=index(own_positions),
        received=int(np.where(split, padded, 0).sum()),
    )


class CPBlock(nn.Module):
    """Pre-norm attention with ``kv_heads`` key/value heads (grouped queries) and a GELU MLP of 4x, no biases."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, varlen: bool) -> None:
        super().__init__()
        if hidden % heads or heads % kv_heads:
            msg = f"hidden {hidden}, heads {heads}, kv_heads {kv_heads}: heads must divide both evenly"
            raise ValueError(msg)
        self.hidden, self.heads, self.kv_heads, self.head_dim = hidden, heads, kv_heads, hidden // heads
        self.varlen, self.grouped = varlen, varlen  # grouped: varlen takes fewer KV heads (else expanded)
        self.norm1, self.norm2 = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.kv = nn.Linear(hidden, 2 * kv_heads * self.head_dim, bias=False)
        self.proj = nn.Linear(hidden, hidden, bias=False)
        self.up, self.down = nn.Linear(hidden, 4 * hidden, bias=False), nn.Linear(4 * hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor, layout: Layout, received: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        h = self.norm1(x)
        q = self.q(h).view(-1, self.heads, self.head_dim)
        k, v = self.kv(h).view(-1, 2, self.kv_heads, self.head_dim).unbind(1)
        out = self._attend(q, k, v, layout.causal, causal=True)
        if layout.full is not None:
            k_all, v_all = (
                buffer.index_copy(0, layout.own_positions, own[layout.own_rows])
                for buffer, own in zip(received, (k, v), strict=True)
            )
            keys = layout.full_keys
            part = self._attend(q[layout.full_rows], k_all[keys], v_all[keys], layout.full, causal=False)
            out = out.index_add(0, layout.full_rows, part)
        x = x + self.proj(out.reshape(-1, self.hidden))
        return x + self.down(F.gelu(self.up(self.norm2(x))))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: Sequences, causal: bool) -> torch.Tensor:
        if self.varlen:
            found = varlen_attention(causal)
            assert found is not None  # checked by the timer
            varlen_attn, how = found
            if self.grouped:
                try:
                    return varlen_attn(q, k, v, s.cu_q, s.cu_k, s.max_q, s.max_k, **how)
                except RuntimeError:
                    self.grouped = False
            k, v = (t.repeat_interleave(self.heads // self.kv_heads, dim=1) for t in (k, v))
            return varlen_attn(q, k, v, s.cu_q, s.cu_k, s.max_q, s.max_k, **how)
        k, v = (t.repeat_interleave(self.heads // self.kv_heads, dim=1) for t in (k, v))
        q_bounds, k_bounds = s.cu_q.tolist(), s.cu_k.tolist()
        return torch.cat(
            [
                F.scaled_dot_product_attention(
                    q[a:b].transpose(0, 1), k[c:d].transpose(0, 1), v[c:d].transpose(0, 1), is_causal=causal
                ).transpose(0, 1)
                for (a, b), (c, d) in zip(itertools.pairwise(q_bounds), itertools.pairwise(k_bounds), strict=True)
            ]
        )


class Timer:
    """ms of one forward and backward of the block over a rank's micro-batch (median of ``repeats`` runs; the
    first micro-batch it times runs once more before, untimed)."""

    def __init__(self, device: str, hidden: int, heads: int, kv_heads: int, repeats: int) -> None:
        self.device = torch.device(device)
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        varlen = self.device.type == "cuda" and varlen_attention(True) is not None
        varlen = varlen and varlen_attention(False) is not None
        torch.manual_seed(0)
        self.block = CPBlock(hidden, heads, kv_heads, varlen).to(self.device, self.dtype)
        self.repeats, self.warm, self.timings_ms = repeats, False, []
        if varlen:  # whether varlen takes fewer KV heads than query heads, forward and backward
            try:
                self.time([(256, 2, 0), (64, 1, 0)])
            except Exception:  # whatever fails with grouped heads: expand them
                self.block.grouped = False
            self.timings_ms.clear()

    def describe(self) -> dict[str, Any]:
        b = self.block
        return {
            "device": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "dtype": str(self.dtype),
            "attention": "varlen" if b.varlen else "sdpa",
            "block": {"hidden": b.hidden, "heads": b.heads, "kv_heads": b.kv_heads, "head_dim": b.head_dim},
        }

    def time(self, samples: list[tuple[int, int, int]]) -> float:
        layout = layout_of(samples, self.device)
        shape = (layout.received, self.block.kv_heads, self.block.head_dim)
        received = tuple(torch.randn(shape, device=self.device, dtype=self.dtype) for _ in range(2))
        x = torch.randn(layout.tokens, self.block.hidden, device=self.device, dtype=self.dtype, requires_grad=True)
        runs = [self._once(x, layout, received) for _ in range(self.repeats + (0 if self.warm else 1))]
        self.warm = True
        ms = statistics.median(runs[-self.repeats :])
        self.timings_ms.append(ms)
        return ms

    def _once(self, x: torch.Tensor, layout: Layout, received: tuple[torch.Tensor, torch.Tensor]) -> float:
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.block(x, layout, received).sum().backward()
            end.record()
            torch.cuda.synchronize(self.device)
            return float(start.elapsed_time(end))
        began = time.perf_counter()
        self.block(x, layout, received).sum().backward()
        return (time.perf_counter() - began) * 1000.0
