"""What a sample costs each rank of a context-parallel block: its share of the compute, and the ring traffic
that compute cannot hide. Pure: the planner, ``mixflow plan`` and the benchmarks score plans with it.

A sample of ``L`` tokens split over ``c`` ranks (zigzag: each rank holds ``2`` of the ``2c`` chunks of the sample
padded to a multiple of ``2c``) costs each of them, in seconds of one training step (forward and backward,
``TRAINING_FACTOR`` times the forward)::

    compute  = (alpha * L**2 + beta * L) / c / flops_per_s
    exposed  = layers * (c - 1) * max(0, kv_bytes(L / c) / bandwidth - 2 * hidden * (L / c)**2 / flops_per_s)
    per rank = TRAINING_FACTOR * (compute + exposed) + gamma

Ring attention passes each rank's K/V chunk (``2 * L/c * kv_heads * head_dim * dtype_bytes`` a layer) round the
block in ``c - 1`` steps; each step overlaps with the attention of one block of ``(L/c)**2`` token pairs, and
only what the transfer takes beyond that shows. ``bandwidth`` is NVLink's where the block lies within one node
(``ranks_per_node`` consecutive ranks), the network's where it spans nodes. ``alpha``, ``beta`` are the
``CostModel``'s in FLOPs (``from_transformer``); ``gamma`` is in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.spec.cost import DEFAULT_COST_MODEL, CostModel

TRAINING_FACTOR = 3.0
"""Forward and backward together, as a multiple of the forward pass (both compute and ring traffic)."""


@dataclass(frozen=True)
class ContextParallelCost:
    """The per-rank cost of a sample over a block of ranks (the module docstring). Defaults: a 7B-class layer
    (hidden 4096: 32 heads, 8 KV heads of 128, 32 layers, bf16), 400 TFLOP/s sustained a GPU, NVLink 400 GB/s
    inside nodes of 8 ranks, 50 GB/s between them."""

    model: CostModel = DEFAULT_COST_MODEL
    layers: int = 32
    hidden_size: int = 4096
    kv_heads: int = 8
    head_dim: int = 128
    dtype_bytes: int = 2
    flops_per_s: float = 400e12
    nvlink_bytes_per_s: float = 400e9
    network_bytes_per_s: float = 50e9
    ranks_per_node: int = 8
    gamma_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("layers", "hidden_size", "kv_heads", "head_dim", "dtype_bytes", "ranks_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                msg = f"{name} must be an integer >= 1, got {value!r}"
                raise ValueError(msg)
        for name in ("flops_per_s", "nvlink_bytes_per_s", "network_bytes_per_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                msg = f"{name} must be a finite number > 0, got {value!r}"
                raise ValueError(msg)
        if not (math.isfinite(self.gamma_s) and self.gamma_s >= 0):
            msg = f"gamma_s must be a finite number >= 0, got {self.gamma_s!r}"
            raise ValueError(msg)

    def within_node(self, first: int | np.ndarray, cp: int | np.ndarray) -> np.ndarray:
        """Whether the block of ``cp`` ranks from rank ``first`` lies within one node."""
        first, cp = np.asarray(first, np.int64), np.asarray(cp, np.int64)
        return (first // self.ranks_per_node) == ((first + cp - 1) // self.ranks_per_node)

    def per_rank(self, lengths: np.ndarray, cp: np.ndarray | int, within_node: np.ndarray | bool = True) -> np.ndarray:
        """Seconds each rank of its block spends on each sample of ``lengths`` split ``cp`` ways (float64)."""
        length = np.asarray(lengths, np.float64)
        c = np.broadcast_to(np.asarray(cp, np.float64), length.shape)
        compute = (self.model.alpha * length * length + self.model.beta * length) / c / self.flops_per_s
        chunk = length / c
        bandwidth = np.where(within_node, self.nvlink_bytes_per_s, self.network_bytes_per_s)
        transfer = 2.0 * chunk * self.kv_heads * self.head_dim * self.dtype_bytes / bandwidth
        overlap = 2.0 * self.hidden_size * chunk * chunk / self.flops_per_s
        exposed = self.layers * (c - 1.0) * np.maximum(0.0, transfer - overlap)
        return TRAINING_FACTOR * (compute + exposed) + self.gamma_s

    def gpu_time(self, lengths: np.ndarray, cp: np.ndarray | int, within_node: np.ndarray | bool = True) -> np.ndarray:
        """Seconds of all the block's ranks together: ``cp`` times ``per_rank``."""
        return np.asarray(cp, np.float64) * self.per_rank(lengths, cp, within_node)
