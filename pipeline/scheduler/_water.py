"""The cost level for the small samples at the end of a longest-first pass (water filling with ceilings).

Once only small samples remain, rank ``r`` holds cost ``a_r`` and ``T_r`` free tokens; the remaining
samples bring cost ``W`` in ``X`` tokens, ``rho = W / X`` per token. Filled to level ``K``, a rank ends at
``min(K, u_r)`` with ``u_r = a_r + rho * T_r`` (it runs out of tokens at ``u_r``). The level is the
highest ``K`` such that the costliest rank stays within ``slack`` of the lower bound of what is placed,
and no higher than the level at which everything remaining is placed.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_BISECTIONS = 48  # the level to 2**-48 of the range: far below a sample's cost


@njit(cache=True)
def _filled(rank_cost: np.ndarray, ceiling: np.ndarray, level: float) -> float:
    total = 0.0
    for r in range(rank_cost.shape[0]):
        total += max(rank_cost[r], min(level, ceiling[r]))
    return total


@njit(cache=True)
def water_level(
    rank_cost: np.ndarray,
    free_tokens: np.ndarray,
    remaining_cost: float,
    remaining_tokens: int,
    largest_cost: float,
    slack: float,
) -> tuple[float, bool]:
    """The level to fill ranks to, and whether it caps them short of placing everything remaining
    (it does not when everything fits in balance, nor when the ranks are unbalanced already)."""
    n_ranks = rank_cost.shape[0]
    if remaining_tokens <= 0:
        return np.inf, False
    per_token = remaining_cost / remaining_tokens
    ceiling = np.empty(n_ranks, np.float64)
    start = 0.0
    already = 0.0
    top = 0.0
    for r in range(n_ranks):
        ceiling[r] = rank_cost[r] + per_token * free_tokens[r]
        start = max(start, rank_cost[r])
        top = max(top, ceiling[r])
        already += rank_cost[r]
    # Level at which all the remaining cost is placed (or every rank is out of tokens).
    target = already + remaining_cost
    if _filled(rank_cost, ceiling, top) <= target:
        fill_level = top
    else:
        low, high = start, top
        for _ in range(_BISECTIONS):
            middle = 0.5 * (low + high)
            if _filled(rank_cost, ceiling, middle) < target:
                low = middle
            else:
                high = middle
        fill_level = high

    def balanced(level: float) -> bool:
        mean = _filled(rank_cost, ceiling, level) / n_ranks
        return level <= (1.0 + slack) * max(mean, largest_cost)

    if balanced(fill_level) or not balanced(start):
        return fill_level, False
    low, high = start, fill_level
    for _ in range(_BISECTIONS):
        middle = 0.5 * (low + high)
        if balanced(middle):
            low = middle
        else:
            high = middle
    return low, True
