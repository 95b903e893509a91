"""``even_parts``: a multimodal step's plan with the total, the vision encoder's part and the LLM's each brought
near its own bound (``largest_rank_bound``), by exchanges that keep what is placed (``_kernels/parts.py``)."""

from __future__ import annotations

import numpy as np

from pipeline.planning.scheduler._kernels.parts import even_parts as even_parts_kernel
from pipeline.planning.scheduler._kernels.state import Candidates, Grid, Placement, micro_bits, patch_limit
from pipeline.planning.scheduler.part_bound import largest_rank_bound
from pipeline.planning.scheduler.plan import DEFAULT_TOLERANCE, StepPlan
from pipeline.planning.shape import StepShape


def even_parts(
    plan: StepPlan,
    lengths: np.ndarray,
    costs: np.ndarray,
    patches: np.ndarray,
    encoder_costs: np.ndarray,
    shape: StepShape,
    tolerance: float = DEFAULT_TOLERANCE,
) -> StepPlan:
    """``plan`` of samples of ``lengths`` tokens, ``patches`` patches and ``costs`` (the LLM's plus the encoder's
    ``encoder_costs``) on ``shape``, its placed samples exchanged between ranks and micro-batches (both capacities
    kept) until no exchange lowers the largest over the three loads of the costliest rank over that load's bound
    (then the sum of the parts' costliest ranks). The same samples are placed; no load ends above that largest
    ratio as it was."""
    placed = np.flatnonzero(plan.placed_mask)
    if placed.size < 2 or plan.ranks < 2:
        return plan
    lengths = np.asarray(lengths, dtype=np.int64)
    costs, encoder = np.asarray(costs, dtype=np.float64), np.asarray(encoder_costs, dtype=np.float64)
    patches = np.asarray(patches, dtype=np.int64)
    held = (lengths[placed], patches[placed])
    loads = (costs, encoder, costs - encoder)
    if all(_near_mean(plan, values[placed], values, tolerance) for values in loads):
        return plan  # the mean bounds each load from below, and the stronger bound too: nothing to gain
    bounds = np.array([largest_rank_bound(values[placed], *held, shape) for values in loads])
    limit = patch_limit(patches, plan.patch_capacity)
    grid = Grid(plan.ranks, plan.micro_batches, plan.capacity, int(micro_bits(plan.micro_batches)), limit)
    rank, micro = plan.rank[placed].astype(np.int64), plan.micro[placed].astype(np.int64)
    slots = rank * plan.micro_batches + micro
    n_slots = plan.ranks * plan.micro_batches
    cands = Candidates(placed.astype(np.int64), held[0].astype(np.int32), costs[placed], held[1], encoder[placed])
    placement = Placement(
        (rank << grid.shift) | micro,
        np.bincount(rank, weights=cands.cost, minlength=plan.ranks),
        np.bincount(slots, weights=held[0], minlength=n_slots).astype(np.int64),
        np.bincount(slots, weights=cands.cost, minlength=n_slots),
        np.bincount(slots, weights=held[1], minlength=n_slots).astype(np.int64),
    )
    even_parts_kernel(cands, placement, grid, bounds, float(tolerance))
    out_rank, out_micro = plan.rank.copy(), plan.micro.copy()
    out_rank[placed] = placement.at >> grid.shift
    out_micro[placed] = placement.at & ((1 << grid.shift) - 1)
    return StepPlan(out_rank, out_micro, plan.ranks, plan.micro_batches, plan.capacity, plan.patch_capacity)


def _near_mean(plan: StepPlan, placed_values: np.ndarray, values: np.ndarray, tolerance: float) -> bool:
    """Whether the plan's costliest rank of ``values`` is within ``tolerance`` of the mean or the costliest
    sample (placed), the least bound of any."""
    bound = max(float(placed_values.sum()) / plan.ranks, float(placed_values.max()))
    return float(plan.rank_totals(values).max()) <= (1 + tolerance) * bound
