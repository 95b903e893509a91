"""``StepShape``: the shape of one global step, as everything that plans, composes, checks or replays a step
takes it. Made once from the spec's ``step`` section (``StepShape.from_spec``). Pure."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pipeline.spec.sections import StepSpec
    from topics.formats.batch import Batch
    from topics.formats.cp_batch import CPBatch


@dataclass(frozen=True)
class StepShape:
    """``ranks`` data-parallel ranks of ``micro_batches`` micro-batches each; a micro-batch holds at most
    ``tokens_per_micro_batch`` tokens and ``patches_per_micro_batch`` vision patches (0: no limit, the
    spec's unset). With ``context_parallel`` (its mode; empty: none) the ranks are every rank of the data x
    context mesh and a micro-batch's tokens a rank's slices. Raises ``ValueError`` naming a field that is not an
    integer in range."""

    ranks: int
    micro_batches: int
    tokens_per_micro_batch: int
    patches_per_micro_batch: int = 0
    context_parallel: str = ""

    def __post_init__(self) -> None:
        for name, least in _LEAST.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < least:
                msg = f"{name} must be an integer >= {least}, got {value!r}"
                raise ValueError(msg)
            object.__setattr__(self, name, int(value))

    @classmethod
    def from_spec(cls, step: StepSpec) -> StepShape:
        """The shape of the spec's ``step`` section."""
        patches = step.patches_per_micro_batch or 0
        mode = step.context_parallel.mode if step.context_parallel is not None else ""
        return cls(step.ranks, step.micro_batches, step.tokens_per_micro_batch, patches, mode)

    @classmethod
    def of_batch(cls, batch: Batch | CPBatch) -> StepShape:
        """The written part (``written``) of the shape of the step ``batch`` belongs to."""
        mode = getattr(batch, "mode", "")
        return cls(batch.ranks, max(1, batch.micro_batches), batch.capacity, context_parallel=mode).written()

    @property
    def tokens_per_step(self) -> int:
        """The step's capacity: ranks * micro_batches * tokens_per_micro_batch."""
        return self.ranks * self.micro_batches * self.tokens_per_micro_batch

    def written(self) -> StepShape:
        """The part of this shape that a job's rank topics fix and a running job keeps: ranks, micro-batches
        and tokens a micro-batch, and the context-parallel mode (the patch budget may change between runs, and
        so may a context-parallel job's micro-batches, as its ranks learn their count every step)."""
        micro_batches = 1 if self.context_parallel else self.micro_batches
        return replace(self, micro_batches=micro_batches, patches_per_micro_batch=0)


_LEAST = {"ranks": 1, "micro_batches": 1, "tokens_per_micro_batch": 1, "patches_per_micro_batch": 0}
"""The least value of each count in a shape."""
