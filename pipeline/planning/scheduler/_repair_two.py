"""The guarantee against starvation with two capacities: no deferred sample may have a newer placed sample
that is at least as long and has at least as many patches (it could take that one's place in both).

With patches all 0 this is ``_repair.py``'s guarantee; the candidates here are in any order (costliest
first), so the searches look at every position rather than at runs of one length.
"""

from __future__ import annotations

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.scheduler._placement import Candidates, Grid, Placement, flat_slot, move_tokens


@kernel
def dominance_safe(cands: Candidates, at: np.ndarray) -> bool:
    """Whether no deferred candidate has a newer placed one at least as long with at least as many patches.

    Longest first, a run of one length at a time: the run's placed candidates join a Fenwick tree of the
    newest sample by patches (most first), then each deferred one of the run asks for the newest placed
    sample with at least its patches among all joined so far."""
    n = cands.order.shape[0]
    by_length = np.argsort(-cands.length.astype(np.int64), kind="mergesort")
    values = np.unique(cands.patches)  # ascending; patch rank q = count - searchsorted(values, p), 1-based
    count = values.shape[0]
    newest = np.full(count + 1, -1, np.int64)  # prefix maxima over q: samples with at least so many patches
    first = 0
    while first < n:
        end = first
        while end < n and cands.length[by_length[end]] == cands.length[by_length[first]]:
            end += 1
        for t in range(first, end):
            k = by_length[t]
            if at[k] >= 0:
                q = count - np.searchsorted(values, cands.patches[k])
                while q <= count:
                    newest[q] = max(newest[q], cands.order[k])
                    q += q & -q
        for t in range(first, end):
            k = by_length[t]
            if at[k] < 0:
                q = count - np.searchsorted(values, cands.patches[k])
                while q > 0:
                    if newest[q] > cands.order[k]:
                        return False
                    q -= q & -q
        first = end
    return True


@kernel
def _newest_placed(cands: Candidates, at: np.ndarray) -> np.int64:
    newest = np.int64(-1)
    for k in range(at.shape[0]):
        if at[k] >= 0:
            newest = max(newest, cands.order[k])
    return newest


@kernel
def _gives_way(cands: Candidates, at: np.ndarray, k: int, sample: int) -> int:
    """The position of the placed sample newer than ``sample`` (at position ``k``) with at least its length and
    patches that is shortest, then has the fewest patches, then is the newest; -1 where there is none."""
    length, patches = cands.length[k], cands.patches[k]
    best = -1
    for j in range(at.shape[0]):
        if at[j] < 0 or cands.order[j] <= sample or cands.length[j] < length or cands.patches[j] < patches:
            continue
        if (
            best < 0
            or cands.length[j] < cands.length[best]
            or (
                cands.length[j] == cands.length[best]
                and (
                    cands.patches[j] < cands.patches[best]
                    or (cands.patches[j] == cands.patches[best] and cands.order[j] > cands.order[best])
                )
            )
        ):
            best = j
    return best


@kernel
def prefer_older_two(cands: Candidates, plan: Placement, grid: Grid) -> int:
    """``_repair.prefer_older`` with both capacities: deferred samples, oldest first, each in the place of a
    newer placed sample at least as long with at least as many patches (``_gives_way``), which is deferred
    instead and may in turn take another's place. Tokens and patches of the micro-batch can only fall (its
    cost may rise: costs need not follow length and patches). In place; returns the swaps."""
    n = cands.order.shape[0]
    waiting = np.zeros(n, np.int64)  # by sample: its position + 1 while it is deferred and waits its turn
    for k in range(n):
        if plan.at[k] < 0:
            waiting[cands.order[k]] = k + 1
    newest = _newest_placed(cands, plan.at)
    swaps = 0
    for i in range(n):
        if newest <= i:
            break  # no placed sample is newer than this one, nor than any deferred after it
        if waiting[i] == 0:
            continue
        k = waiting[i] - 1
        j = _gives_way(cands, plan.at, k, i)
        if j < 0:
            continue
        slot = plan.at[j]
        flat = flat_slot(grid, slot)
        tokens = np.int64(cands.length[k]) - np.int64(cands.length[j])
        move_tokens(plan, slot >> grid.shift, flat, tokens, cands.cost[k] - cands.cost[j])
        plan.patches[flat] += cands.patches[k] - cands.patches[j]
        plan.at[k] = slot
        plan.at[j] = -1
        waiting[cands.order[j]] = j + 1  # newer than ``i``: its turn comes later
        if cands.order[j] == newest:
            newest = _newest_placed(cands, plan.at)
        swaps += 1
    return swaps
