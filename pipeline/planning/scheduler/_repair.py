"""The guarantee against starvation: no deferred sample may have a newer placed sample at least as long.

Plans here are in sorted order (``_placement.py``): position ``k`` holds sample ``order[k]``, longest first
and, among samples of one length, oldest first; ``at[k]`` is ``rank << shift | micro_batch``, or -1.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.kernels.trees import leftmost_above, set_leaf
from pipeline.planning.scheduler._placement import Candidates, Grid, Placement, flat_slot, move_tokens


@kernel
def starvation_safe(cands: Candidates, at: np.ndarray) -> bool:
    """Whether no deferred candidate has a newer placed one at least as long (later samples are not
    candidates: they are deferred and newer than every candidate)."""
    order, length = cands.order, cands.length
    newest = -1  # the newest placed sample longer than the current length
    first = 0
    while first < order.shape[0]:
        end = first
        while end < order.shape[0] and length[end] == length[first]:
            end += 1
        last_placed = end - 1  # within one length, a later position is a newer sample
        while last_placed >= first and at[last_placed] < 0:
            last_placed -= 1
        for k in range(first, end):
            if at[k] < 0 and (newest > order[k] or last_placed > k):
                return False
        if last_placed >= first:
            newest = max(newest, order[last_placed])
        first = end
    return True


@kernel
def deferred_oldest_first(order: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Positions of the deferred candidates, oldest sample first."""
    deferred = np.flatnonzero(at < 0)
    return deferred[np.argsort(order[deferred], kind="mergesort")]


class Runs(NamedTuple):
    """Runs of one length in sorted order, longest first: run ``g`` is positions ``start[g]..start[g+1]-1``,
    ``of[k]`` the run of position ``k``; ``newest`` a max segment tree over the runs by increasing length
    (run ``g`` at leaf ``count - 1 - g``), each leaf the newest placed sample of its run or -1, and
    ``top[g]`` that sample's position."""

    start: np.ndarray
    of: np.ndarray
    count: int
    newest: np.ndarray
    leaves: int
    top: np.ndarray


@kernel
def _runs(cands: Candidates, at: np.ndarray) -> Runs:
    n = cands.length.shape[0]
    start = np.empty(n + 1, np.int64)
    of = np.empty(n, np.int32)
    count = 0
    for k in range(n):
        if k == 0 or cands.length[k] != cands.length[k - 1]:
            start[count] = k
            count += 1
        of[k] = count - 1
    start[count] = n
    leaves = 1
    while leaves < count:
        leaves *= 2
    newest = np.full(2 * leaves, -1, np.int64)
    top = np.empty(count, np.int64)
    for g in range(count):
        k = start[g + 1] - 1
        while k >= start[g] and at[k] < 0:
            k -= 1
        top[g] = k
        if k >= start[g]:
            newest[leaves + count - 1 - g] = cands.order[k]
    for node in range(leaves - 1, 0, -1):
        newest[node] = max(newest[2 * node], newest[2 * node + 1])
    return Runs(start, of, count, newest, leaves, top)


@kernel
def prefer_older(cands: Candidates, plan: Placement, grid: Grid) -> int:
    """Swap deferred samples into the places of newer, at least as long placed samples, in place, oldest
    deferred sample first, until no deferred sample has a newer placed one at least as long. Each swap
    takes the shortest such sample (the newest among equals), so tokens and costs of the micro-batch and
    rank can only fall; the sample that gives way is newer and may in turn take another's place.
    Returns the number of swaps."""
    n = cands.order.shape[0]
    runs = _runs(cands, plan.at)
    waiting = np.zeros(n, np.int64)  # by sample: its position + 1 while it is deferred and waits its turn
    for k in range(n):
        if plan.at[k] < 0:
            waiting[cands.order[k]] = k + 1
    swaps = 0
    for i in range(n):
        if waiting[i] == 0:
            continue
        if runs.newest[1] <= i:
            break  # no placed sample is newer than this one, nor than any deferred after it
        k = waiting[i] - 1
        leaf = leftmost_above(runs.newest, runs.leaves, runs.count - 1 - runs.of[k], i)
        if leaf >= 0:
            gives_way = _swap(cands, plan, grid, runs, k, runs.count - 1 - leaf)
            waiting[cands.order[gives_way]] = gives_way + 1  # newer than ``i``: its turn comes later
            swaps += 1
    return swaps


@kernel
def _swap(cands: Candidates, plan: Placement, grid: Grid, runs: Runs, k: int, h: int) -> int:
    """Put the deferred sample at position ``k`` in the place of run ``h``'s newest placed sample, which is
    deferred instead; returns that one's position."""
    kj = runs.top[h]
    slot = plan.at[kj]
    tokens = np.int64(cands.length[k]) - np.int64(cands.length[kj])
    move_tokens(plan, slot >> grid.shift, flat_slot(grid, slot), tokens, cands.cost[k] - cands.cost[kj])
    plan.at[k] = slot
    plan.at[kj] = -1
    previous = kj - 1
    while previous >= runs.start[h] and plan.at[previous] < 0:
        previous -= 1
    runs.top[h] = previous
    set_leaf(runs.newest, runs.leaves, runs.count - 1 - h, cands.order[previous] if previous >= runs.start[h] else -1)
    return kj
