"""Which micro-batch of a rank takes a sample, where a plan is improved after LPT.

Rank ``r``'s micro-batch ``m`` lives at flat position ``r * n_micro + m`` of the per-micro-batch arrays.
"""

from __future__ import annotations

import numpy as np

from pipeline.planning.kernels.jit import kernel


@kernel(inline="always")
def micro_with_room(tokens: np.ndarray, micro_cost: np.ndarray, base: int, n_micro: int, fits: int) -> int:
    """The least costly micro-batch of the rank at ``base`` holding at most ``fits`` tokens, or -1."""
    best = -1
    for m in range(n_micro):
        held = tokens[base + m]
        if held <= fits and (
            best < 0
            or micro_cost[base + m] < micro_cost[base + best]
            or (micro_cost[base + m] == micro_cost[base + best] and held < tokens[base + best])
        ):
            best = m
    return best
