"""Which data-parallel rank a training process is, from its global rank and the parallel sizes.

Ranks are laid out as Megatron-LM does by default (order ``tp-cp-dp-pp``): tensor-parallel peers are
adjacent, then context-parallel, then data-parallel, and pipeline stages outermost. Every peer that
shares a data-parallel rank trains on the same batches, so all of them read the same rank topic.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from topics.errors import MixflowError


@dataclass(frozen=True, slots=True)
class ParallelLayout:
    """``world_size`` processes split into tensor x context x data x pipeline parallel groups."""

    world_size: int
    tensor: int = 1
    context: int = 1
    pipeline: int = 1

    def __post_init__(self) -> None:
        for name in ("world_size", "tensor", "context", "pipeline"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                msg = f"{name} must be a positive int, not {value!r}"
                raise MixflowError(msg)
        model_parallel = self.tensor * self.context * self.pipeline
        if self.world_size % model_parallel:
            msg = (
                f"world size {self.world_size} is not a multiple of tensor x context x pipeline parallel "
                f"{self.tensor} x {self.context} x {self.pipeline} = {model_parallel}"
            )
            raise MixflowError(msg)

    @property
    def data_parallel(self) -> int:
        return self.world_size // (self.tensor * self.context * self.pipeline)

    def data_parallel_rank(self, global_rank: int) -> int:
        """The data-parallel rank of process ``global_rank`` (``0 <= global_rank < world_size``)."""
        if isinstance(global_rank, bool) or not isinstance(global_rank, int) or not 0 <= global_rank < self.world_size:
            msg = f"global rank must be an int in [0, {self.world_size}), not {global_rank!r}"
            raise MixflowError(msg)
        return (global_rank // (self.tensor * self.context)) % self.data_parallel


def rank_from_environment(
    environ: Mapping[str, str] | None = None, *, tensor: int = 1, context: int = 1, pipeline: int = 1
) -> tuple[int, int]:
    """``(data-parallel rank, data-parallel size)`` of this process under ``torchrun`` (``RANK`` and
    ``WORLD_SIZE``); ``(0, 1)`` when neither is set. Raises ``MixflowError`` on a partial or bad setting."""
    env = os.environ if environ is None else environ
    rank, world = env.get("RANK"), env.get("WORLD_SIZE")
    if rank is None and world is None:
        return 0, 1
    try:
        layout = ParallelLayout(int(world or ""), tensor, context, pipeline)
        return layout.data_parallel_rank(int(rank or "")), layout.data_parallel
    except ValueError as exc:
        msg = f"RANK={rank!r} and WORLD_SIZE={world!r} in the environment are not a rank and a world size"
        raise MixflowError(msg) from exc
