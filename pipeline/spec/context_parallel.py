"""The spec's context-parallel sections: ``step.context_parallel`` (which blocks of ranks a sample may span) and
``cost.context_parallel`` (what a block's ranks pay: compute and ring traffic)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ContextParallelSpec(BaseModel):
    """Long samples split over blocks of ranks (``docs/balancing.md``, *Context parallelism*): ``static``, one
    block size for every sample; ``aligned``, a power of two a sample on blocks aligned to it (Megatron-Core's
    hybrid context parallelism); ``free``, any size on any consecutive ranks (ByteScale's)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["static", "aligned", "free"] = Field(description="Which blocks a sample may span.")
    size: int = Field(ge=1, description="The largest block, in ranks (static: every block).")
    max_micro_batches: int | None = Field(
        None,
        ge=1,
        description="The most micro-batches a rank runs in a step (default: twice micro_batches; static: "
        "micro_batches).",
    )

    def longest_sample(self, tokens_per_micro_batch: int) -> int:
        """The longest sample a block of ``size`` ranks holds: its slices, padded to ``2 * size``, each within a
        rank's ``tokens_per_micro_batch``."""
        if self.size == 1:
            return tokens_per_micro_batch
        return 2 * self.size * (tokens_per_micro_batch // 2)


class ContextParallelCostSpec(BaseModel):
    """What a sample costs each rank of a context-parallel block (``pipeline.spec.cp_cost``): the LLM's FLOPs
    (the section around it, in FLOPs: ``hidden_size``/``num_layers``, or alpha/beta as FLOPs) split over the
    block, and the ring attention's K/V traffic that the attention cannot hide, over NVLink within a node and the
    network across nodes. Defaults: 8 KV heads of 128 in bf16, 400 TFLOP/s, 400 and 50 GB/s, 8 ranks a node."""

    model_config = ConfigDict(extra="forbid")

    kv_heads: int = Field(8, ge=1, description="Key/value heads of the attention (grouped-query attention).")
    head_dim: int = Field(128, ge=1, description="Width of one head.")
    dtype_bytes: int = Field(2, ge=1, description="Bytes of one value of the keys and values (2: bf16).")
    tflops: float = Field(400.0, gt=0, allow_inf_nan=False, description="Sustained TFLOP/s of one rank.")
    nvlink_gb_s: float = Field(400.0, gt=0, allow_inf_nan=False, description="GB/s between ranks of one node.")
    network_gb_s: float = Field(50.0, gt=0, allow_inf_nan=False, description="GB/s between ranks of two nodes.")
    ranks_per_node: int = Field(
        8, ge=1, description="Consecutive ranks on one node (GPUs a node over tensor parallel)."
    )
    gamma_s: float = Field(
        0.0, ge=0, allow_inf_nan=False, description="Seconds a sample costs a rank, whatever its length."
    )
