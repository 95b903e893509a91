"""``rank_order``: the order in which one rank's samples go into its batch."""

from __future__ import annotations

import numpy as np

from pipeline.scheduler.plan import StepPlan


def rank_order(plan: StepPlan, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """The samples ``plan`` gives to ``rank``, micro-batch after micro-batch and oldest first within each:
    ``(indices, micro_batch)``, int64 sample indices and the int32 micro-batch of each. The packed arrays
    of each micro-batch (``cu_seqlens``, ``position_ids``, labels) are derived from the batch on the
    trainer side (``topics.packing``), not here."""
    if isinstance(rank, bool) or not isinstance(rank, int | np.integer) or not 0 <= rank < plan.ranks:
        msg = f"rank must be an integer in [0, {plan.ranks}), got {rank!r}"
        raise ValueError(msg)
    mine = np.flatnonzero(plan.rank == rank)  # ascending: oldest first
    indices = mine[np.argsort(plan.micro[mine], kind="stable")].astype(np.int64)
    return indices, plan.micro[indices].astype(np.int32)
