"""A step's samples and grid as the kernels take them, from ``plan_step``'s (checked) arguments."""

from __future__ import annotations

import numpy as np

from pipeline.planning.scheduler._args import check_costs, check_patches
from pipeline.planning.scheduler._lpt import micro_bits
from pipeline.planning.scheduler._placement import Grid, Samples
from pipeline.spec.cost import CostModel

_NO_PATCHES = np.zeros(0, np.int64)
_NO_COSTS = np.zeros(0, np.float64)


def step_inputs(
    lengths: np.ndarray,
    shape: tuple[int, int, int],
    cost_model: CostModel,
    costs: object | None,
    patches: object | None,
    patch_capacity: object,
    encoder_costs: object | None = None,
) -> tuple[Samples, Grid]:
    """``Samples`` and ``Grid`` for ``lengths`` (checked) on ``shape`` (ranks, micro-batches, capacity).

    With one capacity (no ``costs``, no ``patch_capacity``) the costs are ``cost_model``'s and the patches
    empty. Otherwise every phase plans with two: the patches given (or none), and ``patch_capacity``, or
    where that is 0 (no limit) one no micro-batch can reach, so only the order by cost differs.
    ``encoder_costs`` (only with ``costs``) is the vision encoder's part of them, evened out too."""
    ranks, micro_batches, capacity = shape
    checked, limit = check_patches(patches, lengths.size, patch_capacity)
    if encoder_costs is not None and costs is None:
        msg = "encoder_costs is the encoder's part of costs: give costs too"
        raise ValueError(msg)
    if costs is None and limit == 0:
        grid = Grid(ranks, micro_batches, capacity, int(micro_bits(micro_batches)), 0)
        return Samples(lengths, cost_model.costs(lengths), _NO_PATCHES, _NO_COSTS), grid
    the_costs = cost_model.costs(lengths) if costs is None else check_costs(costs, lengths.size)
    the_patches = np.zeros(lengths.size, np.int64) if checked is None else checked
    encoder = _NO_COSTS if encoder_costs is None else check_costs(encoder_costs, lengths.size, "encoder_costs")
    if limit == 0:
        limit = max(1, int(the_patches.sum()))
    grid = Grid(ranks, micro_batches, capacity, int(micro_bits(micro_batches)), limit)
    return Samples(lengths, the_costs, the_patches, encoder), grid
