"""``plan_lpt``: plain LPT over a step's candidates, the baseline ``plan_step`` is measured against."""

from __future__ import annotations

import numpy as np

from pipeline.planning.scheduler._kernels.greedy import lpt_kernel
from pipeline.planning.scheduler._kernels.repair import prefer_older
from pipeline.planning.scheduler._kernels.state import at_dtype, by_index, check_step, empty_base, step_inputs
from pipeline.planning.scheduler.plan import StepPlan
from pipeline.spec.cost import DEFAULT_COST_MODEL, CostModel


def plan_lpt(
    lengths: np.ndarray,
    ranks: int,
    micro_batches: int,
    capacity: int,
    cost_model: CostModel = DEFAULT_COST_MODEL,
    *,
    starvation_safe: bool = False,
    costs: np.ndarray | None = None,
    patches: np.ndarray | None = None,
    patch_capacity: int = 0,
) -> StepPlan:
    """Plain LPT (longest processing time first) over the candidates ``plan_step`` considers: the longest
    prefix of ``lengths`` whose tokens fit in ``ranks * micro_batches * capacity``, the rest deferred.

    By cost, highest first (so longest first; ties by index), each sample goes to the least costly rank
    (ties: the lowest) with a micro-batch with room for it, into its first micro-batch with room; a
    sample no micro-batch has room for is deferred.

    Plain LPT may defer an old sample while it places a newer one at least as long. With
    ``starvation_safe``, the scheduler's swap repair then puts each such older sample in the place of a
    newer one, the shortest at least as long (``prefer_older``): the reference ``plan_step`` is
    never worse than.

    ``costs``, ``patches`` and ``patch_capacity`` as for ``plan_step``: with them, the prefix fits both
    rooms, the order is by cost, a micro-batch has room for both, and the repair is on length and patches.
    """
    lengths, ranks, micro_batches, capacity = check_step(lengths, ranks, micro_batches, capacity)
    shape = (ranks, micro_batches, capacity)
    samples, grid = step_inputs(lengths, shape, cost_model, costs, patches, patch_capacity)
    at = np.empty(lengths.size, at_dtype(ranks, micro_batches))
    cands, plan = lpt_kernel(samples, grid, at, empty_base(ranks, micro_batches))
    if starvation_safe:
        prefer_older(cands, plan, grid)
    rank, micro = by_index(lengths.size, cands.order, plan.at, grid.shift)
    return StepPlan(rank, micro, ranks, micro_batches, capacity, int(patch_capacity))
