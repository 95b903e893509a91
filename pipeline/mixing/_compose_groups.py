"""The numba kernel that builds one group of long samples per rank up to a level of excess cost.

Seeds go first, the largest first, each onto the rank with the least excess that has room in a
micro-batch (else onto the least loaded rank). Then the rank with the least excess, while more than
``slack`` below the level, takes the candidate with the largest excess that keeps it at most ``slack``
above the level and fits one of its micro-batches; a rank that finds none is closed. A sample goes into
the fullest micro-batch with room for it, which keeps whole micro-batches free for the next long ones.
Every tie is broken by index, so the result is the same on any machine.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _room(bins: np.ndarray, r: int, length: int, capacity: int) -> int:
    """The fullest micro-batch of rank ``r`` with room for ``length`` tokens; -1 if none."""
    best, best_fill = -1, -1
    for m in range(bins.shape[1]):
        held = bins[r, m]
        if held + length <= capacity and held > best_fill:
            best, best_fill = m, held
    return best


@njit(cache=True)
def _next_free(skip: np.ndarray, j: int) -> int:
    """The first position >= ``j`` of the ranked candidates not chosen yet (``skip`` is path-compressed)."""
    root = j
    while skip[root] != root:
        root = skip[root]
    while skip[j] != root:
        nxt = skip[j]
        skip[j] = root
        j = nxt
    return root


@njit(cache=True)
def build_groups_kernel(
    seed_excess: np.ndarray,
    seed_length: np.ndarray,
    cand_excess: np.ndarray,
    cand_length: np.ndarray,
    cand_source: np.ndarray,
    held: np.ndarray,
    order: np.ndarray,
    allowance: np.ndarray,
    level: float,
    slack: float,
    ranks: int,
    micro_batches: int,
    capacity: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(chosen candidates as a bool mask, excess per rank). ``order`` ranks the candidates by decreasing
    excess; ``held`` marks candidates already among the seeds (chosen, never picked again); a candidate
    counts against its source's ``allowance`` (tokens), which only the last one picked from a source may
    overshoot."""
    excess = np.zeros(ranks)
    bins = np.zeros((ranks, micro_batches), dtype=np.int64)
    for i in np.argsort(-seed_excess, kind="mergesort"):
        length = seed_length[i]
        target, target_m = -1, -1
        for r in range(ranks):
            if target >= 0 and excess[r] >= excess[target]:
                continue
            m = _room(bins, r, length, capacity)
            if m >= 0:
                target, target_m = r, m
        if target < 0:
            target = int(np.argmin(excess))
        else:
            bins[target, target_m] += length
        excess[target] += seed_excess[i]

    n = len(order)
    chosen = held.copy()
    left = allowance.astype(np.float64)
    ranked = np.empty(n)
    skip = np.arange(n + 1)
    for j in range(n):
        ranked[j] = -cand_excess[order[j]]  # increasing
        if held[order[j]]:
            skip[j] = j + 1
    closed = np.zeros(ranks, dtype=np.bool_)
    while True:
        r = -1
        for k in range(ranks):
            if not closed[k] and (r < 0 or excess[k] < excess[r]):
                r = k
        if r < 0:
            break
        if level - excess[r] <= slack:
            closed[r] = True
            continue
        j = _next_free(skip, int(np.searchsorted(ranked, excess[r] - level - slack)))
        pick, pick_m = -1, -1
        while j < n:
            c = order[j]
            if left[cand_source[c]] > 0:
                m = _room(bins, r, cand_length[c], capacity)
                if m >= 0:
                    pick, pick_m = j, m
                    break
            j = _next_free(skip, j + 1)
        if pick < 0:
            closed[r] = True
            continue
        c = order[pick]
        skip[pick] = pick + 1
        chosen[c] = True
        bins[r, pick_m] += cand_length[c]
        excess[r] += cand_excess[c]
        left[cand_source[c]] -= cand_length[c]
    return chosen, excess
