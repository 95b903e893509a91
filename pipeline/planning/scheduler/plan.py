"""``plan_step``: assign every candidate sample of one global step a rank and a micro-batch, or defer it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.planning.scheduler._kernels.state import (
    Grid,
    Placement,
    Samples,
    at_dtype,
    check_step,
    empty_base,
    step_inputs,
)
from pipeline.planning.scheduler._kernels.step import plan_kernel
from pipeline.spec.cost import DEFAULT_COST_MODEL, CostModel

# Samples move off the costliest ranks while they are more than this far above the lower bound.
DEFAULT_TOLERANCE = 0.001


@dataclass(frozen=True, eq=False)
class PlanSummary:
    """Statistics of a plan; costs in the cost model's unit."""

    samples: int
    placed: int
    deferred: int
    tokens_placed: int
    token_capacity: int
    max_rank_cost: float
    lower_bound: float
    balance_ratio: float  # max_rank_cost / lower_bound, 1.0 is perfect
    micro_imbalance: float  # largest over ranks of (costliest micro-batch / mean micro-batch), 1.0 is perfect

    def lines(self) -> list[str]:
        return [
            f"samples={self.samples} placed={self.placed} deferred={self.deferred}",
            f"tokens placed={self.tokens_placed} / capacity={self.token_capacity}"
            f" ({self.tokens_placed / self.token_capacity:.2%})",
            f"max rank cost={self.max_rank_cost:.6g} / lower bound={self.lower_bound:.6g}"
            f" (ratio {self.balance_ratio:.4f})",
            f"micro-batch imbalance={self.micro_imbalance:.4f}",
        ]


@dataclass(frozen=True, eq=False)
class StepPlan:
    """Where each sample of a step goes: ``rank[i]``, ``micro[i]`` (int32), both -1 when deferred.
    ``patch_capacity``: the vision patches a micro-batch holds at most (0: no limit)."""

    rank: np.ndarray
    micro: np.ndarray
    ranks: int
    micro_batches: int
    capacity: int
    patch_capacity: int = 0

    @property
    def placed_mask(self) -> np.ndarray:
        return self.rank >= 0

    @property
    def deferred_indices(self) -> np.ndarray:
        """Indices of deferred samples, oldest first (int64)."""
        return np.flatnonzero(self.rank < 0)

    def micro_costs(
        self, lengths: np.ndarray, cost_model: CostModel = DEFAULT_COST_MODEL, *, costs: np.ndarray | None = None
    ) -> np.ndarray:
        """Cost of every micro-batch, shape (ranks, micro_batches); ``costs`` (one per sample, such as the LLM's
        plus the vision encoder's) instead of ``cost_model``'s where given."""
        placed = self.placed_mask
        slots = self.rank[placed].astype(np.int64) * self.micro_batches + self.micro[placed]
        weights = _costs(lengths, cost_model, costs)[placed]
        flat = np.bincount(slots, weights=weights, minlength=self.ranks * self.micro_batches)
        return flat.reshape(self.ranks, self.micro_batches)

    def rank_costs(self, lengths: np.ndarray, cost_model: CostModel = DEFAULT_COST_MODEL) -> np.ndarray:
        return self.rank_totals(cost_model.costs(np.asarray(lengths)))

    def rank_totals(self, values: np.ndarray) -> np.ndarray:
        """Per rank, the sum of ``values`` (one per sample: costs of any kind, patches) over its samples."""
        placed = self.placed_mask
        weights = np.asarray(values, dtype=np.float64)[placed]
        return np.bincount(self.rank[placed], weights=weights, minlength=self.ranks)

    def lower_bound(
        self, lengths: np.ndarray, cost_model: CostModel = DEFAULT_COST_MODEL, *, costs: np.ndarray | None = None
    ) -> float:
        """``max(total placed cost / ranks, largest placed cost)``: no plan of these samples does better."""
        placed_costs = _costs(lengths, cost_model, costs)[self.placed_mask]
        if placed_costs.size == 0:
            return 0.0
        return max(float(placed_costs.sum()) / self.ranks, float(placed_costs.max()))

    def summary(
        self, lengths: np.ndarray, cost_model: CostModel = DEFAULT_COST_MODEL, *, costs: np.ndarray | None = None
    ) -> PlanSummary:
        lengths = np.asarray(lengths)
        placed = self.placed_mask
        micro_costs = self.micro_costs(lengths, cost_model, costs=costs)
        rank_costs = micro_costs.sum(axis=1)
        max_rank_cost = float(rank_costs.max())
        lower_bound = self.lower_bound(lengths, cost_model, costs=costs)
        busy = rank_costs > 0
        mean_micro = rank_costs[busy] / self.micro_batches
        micro_imbalance = float((micro_costs[busy].max(axis=1) / mean_micro).max()) if busy.any() else 1.0
        return PlanSummary(
            samples=int(lengths.size),
            placed=int(placed.sum()),
            deferred=int(lengths.size - placed.sum()),
            tokens_placed=int(lengths[placed].sum()),
            token_capacity=self.ranks * self.micro_batches * self.capacity,
            max_rank_cost=max_rank_cost,
            lower_bound=lower_bound,
            balance_ratio=max_rank_cost / lower_bound if lower_bound > 0 else 1.0,
            micro_imbalance=micro_imbalance,
        )


def _costs(lengths: np.ndarray, cost_model: CostModel, costs: np.ndarray | None) -> np.ndarray:
    return cost_model.costs(np.asarray(lengths)) if costs is None else np.asarray(costs, dtype=np.float64)


def plan_step(
    lengths: np.ndarray,
    ranks: int,
    micro_batches: int,
    capacity: int,
    cost_model: CostModel = DEFAULT_COST_MODEL,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    start: np.ndarray | None = None,
    costs: np.ndarray | None = None,
    patches: np.ndarray | None = None,
    patch_capacity: int = 0,
    encoder_costs: np.ndarray | None = None,
) -> StepPlan:
    """Plan one global step over ``ranks`` data-parallel ranks of ``micro_batches`` micro-batches,
    each holding at most ``capacity`` tokens (and at most ``patch_capacity`` vision patches, where > 0).

    ``lengths`` (int, 1-D) are the candidates in priority order, index 0 the oldest. Only the longest
    prefix whose tokens fit in ``ranks * micro_batches * capacity`` is considered; the rest is
    deferred. The plan starts from plain LPT over that prefix (``plan_lpt``) and is never worse than LPT
    made starvation-safe (``plan_lpt(..., starvation_safe=True)``) on fill (tokens placed) nor on balance
    (costliest rank over the lower bound of what is placed); where plain LPT keeps the starvation
    guarantee itself, the two are the same plan. Of LPT repaired and LPT with the newest samples held
    back and put back oldest first, it keeps the second where it is at least as good as the first on
    both, else the first with its deferred samples put where there is room (``_kernels/step.py``). Last, samples
    move off the costliest ranks while they are more than ``tolerance`` above the lower bound. Costs are
    ``cost_model.costs``, added in a fixed order, and every tie is broken by index, so the plan is the
    same on any machine.

    ``start``, where given, is a placement to consider too (``rank * micro_batches + m`` per sample, -1
    for none; at most ``capacity`` tokens a micro-batch), such as the packing that step composition chose
    the samples for (``Draw.placement``): completed the same way (its deferred samples where there is
    room, then starvation-safe), it is kept instead of the plan above where it scores higher on balance
    (mean over costliest rank) times fill. The comparison with LPT above holds for the plan without it.

    Guarantee against starvation: no deferred sample has a newer placed sample at least as long (it
    could always take that one's place).

    **Multimodal steps.** ``costs`` (float64 per sample, such as the LLM's cost plus the vision encoder's)
    replace ``cost_model.costs(lengths)`` where given; ``patches`` (int per sample) are each sample's vision
    patches, and with ``patch_capacity > 0`` no micro-batch holds more than that many, in every phase.
    With either, the candidates go costliest first and the guarantee becomes: no deferred sample has a
    newer placed sample that is at least as long and has at least as many patches. ``start`` must keep
    both capacities. Last, placed samples trade places between ranks where full micro-batches leave no
    room to move them, and ``encoder_costs`` (the vision encoder's part of ``costs``, where given) is
    evened out over the ranks as far as that lifts no rank above the costliest (``_kernels/trades.py``). Without
    them (text) the plan is the one described above, bit for bit.
    """
    return _plan(lengths, ranks, micro_batches, capacity, cost_model, None, tolerance, start, costs, patches,
                 patch_capacity, encoder_costs)  # fmt: skip


def plan_step_on(
    lengths: np.ndarray,
    ranks: int,
    micro_batches: int,
    capacity: int,
    cost_model: CostModel,
    base: Placement,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
) -> StepPlan:
    """``plan_step`` (text) of a step that holds ``base`` before its candidates: each rank's cost
    ``base.rank_cost`` and each micro-batch's tokens ``base.tokens`` (a micro-batch it fills takes none of
    them), such as the context-parallel blocks ``plan_cp_step`` placed first."""
    return _plan(lengths, ranks, micro_batches, capacity, cost_model, base, tolerance, None, None, None, 0, None)


def _plan(
    lengths: np.ndarray,
    ranks: int,
    micro_batches: int,
    capacity: int,
    cost_model: CostModel,
    base: Placement | None,
    tolerance: float,
    start: np.ndarray | None,
    costs: np.ndarray | None,
    patches: np.ndarray | None,
    patch_capacity: int,
    encoder_costs: np.ndarray | None,
) -> StepPlan:
    lengths, ranks, micro_batches, capacity = check_step(lengths, ranks, micro_batches, capacity)
    if not isinstance(tolerance, float | int) or not 0 <= tolerance < 1:
        msg = f"tolerance must be a number in [0, 1), got {tolerance!r}"
        raise ValueError(msg)
    shape = (ranks, micro_batches, capacity)
    samples, grid = step_inputs(lengths, shape, cost_model, costs, patches, patch_capacity, encoder_costs)
    start = _check_start(start, samples, grid)
    scratch = np.empty(lengths.size, at_dtype(ranks, micro_batches))
    base = empty_base(ranks, micro_batches) if base is None else base
    rank, micro = plan_kernel(samples, grid, float(tolerance), scratch, start, base)
    return StepPlan(rank, micro, ranks, micro_batches, capacity, int(patch_capacity))


def _check_start(start: np.ndarray | None, samples: Samples, grid: Grid) -> np.ndarray:
    """``start`` as contiguous int64 (empty for None), or ValueError saying what is wrong with it."""
    if start is None:
        return np.zeros(0, np.int64)
    lengths, slots, capacity = samples.lengths, grid.ranks * grid.micro, grid.capacity
    array = np.asarray(start)
    if array.shape != lengths.shape or not np.issubdtype(array.dtype, np.integer):
        msg = f"start must be integers, one per sample ({lengths.size}), got {array.dtype} of shape {array.shape}"
        raise ValueError(msg)
    array = np.ascontiguousarray(array, dtype=np.int64)
    wrong = np.flatnonzero((array < -1) | (array >= slots))
    if wrong.size:
        msg = f"start[{int(wrong[0])}] = {int(array[wrong[0]])} is not a micro-batch (-1 or 0..{slots - 1})"
        raise ValueError(msg)
    placed = array >= 0
    held = np.bincount(array[placed], weights=lengths[placed], minlength=slots)
    if held.size and held.max() > capacity:
        slot = int(np.argmax(held))
        msg = f"start puts {int(held[slot])} tokens in micro-batch {slot}, more than its capacity {capacity}"
        raise ValueError(msg)
    if grid.patch_capacity > 0:
        held = np.bincount(array[placed], weights=samples.patches[placed], minlength=slots)
        if held.size and held.max() > grid.patch_capacity:
            slot = int(np.argmax(held))
            msg = (
                f"start puts {int(held[slot])} patches in micro-batch {slot}, more than its patch capacity "
                f"{grid.patch_capacity}"
            )
            raise ValueError(msg)
    return array
