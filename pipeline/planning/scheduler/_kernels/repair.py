"""The guarantee against starvation: no deferred sample may have a newer placed sample that could take its
place, one at least as long (and, where a micro-batch bounds patches, with at least as many patches).

Plans here are in sorted order (``state.py``): position ``k`` holds sample ``order[k]``; ``at[k]`` is
``rank << shift | micro_batch``, or -1. The searches run over *runs*: the candidates of one room need
(length, and patches where they are bounded), ``by_room`` ordering them most room first and, within a run,
oldest first. With tokens only the candidates are in that order already (longest first, then oldest).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.kernels.trees import leftmost_above, set_leaf
from pipeline.planning.scheduler._kernels.state import Candidates, Grid, Placement, flat_slot, move_tokens, patches_of


@kernel
def deferred_oldest_first(order: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Positions of the deferred candidates, oldest sample first."""
    deferred = np.flatnonzero(at < 0)
    return deferred[np.argsort(order[deferred], kind="mergesort")]


class Runs(NamedTuple):
    """Runs of one room need in ``by_room`` order, most room first: run ``g`` is ``by_room[start[g] :
    start[g + 1]]``, ``of[k]`` the run of position ``k``; ``newest`` a max segment tree over the runs from least
    to most room (run ``g`` at leaf ``count - 1 - g``: by length, then patches), each leaf the newest placed
    sample of its run or -1, and ``top[g]`` the index in ``by_room`` of that sample."""

    by_room: np.ndarray
    start: np.ndarray
    of: np.ndarray
    count: int
    newest: np.ndarray
    leaves: int
    top: np.ndarray


@kernel
def _by_room(cands: Candidates, grid: Grid) -> np.ndarray:
    """The positions by decreasing length, then decreasing patches, then increasing age."""
    n = cands.length.shape[0]
    if grid.patch_capacity == 0:
        return np.arange(n)  # longest first, then oldest: the candidates' own order
    by_age = np.argsort(cands.order, kind="mergesort")
    key = np.empty(n, np.int64)
    for t in range(n):  # a micro-batch's tokens and patches each fit in 31 bits
        key[t] = -((np.int64(cands.length[by_age[t]]) << 32) | cands.patches[by_age[t]])
    return by_age[np.argsort(key, kind="mergesort")]  # stable: in age order within a run


@kernel
def _runs(cands: Candidates, grid: Grid, at: np.ndarray) -> Runs:
    n = cands.length.shape[0]
    by_room = _by_room(cands, grid)
    start = np.empty(n + 1, np.int64)
    of = np.empty(n, np.int32)
    count = 0
    for t in range(n):
        k = by_room[t]
        if t == 0 or _need(cands, grid, k) != _need(cands, grid, by_room[t - 1]):
            start[count] = t
            count += 1
        of[k] = count - 1
    start[count] = n
    leaves = 1
    while leaves < count:
        leaves *= 2
    newest = np.full(2 * leaves, -1, np.int64)
    top = np.empty(count, np.int64)
    for g in range(count):
        t = start[g + 1] - 1
        while t >= start[g] and at[by_room[t]] < 0:
            t -= 1
        top[g] = t
        if t >= start[g]:
            newest[leaves + count - 1 - g] = cands.order[by_room[t]]
    for node in range(leaves - 1, 0, -1):
        newest[node] = max(newest[2 * node], newest[2 * node + 1])
    return Runs(by_room, start, of, count, newest, leaves, top)


@kernel(inline="always")
def _need(cands: Candidates, grid: Grid, k: np.int64) -> tuple[np.int64, np.int64]:
    return np.int64(cands.length[k]), patches_of(cands, grid, k)


@kernel
def _giving_way(cands: Candidates, grid: Grid, runs: Runs, k: np.int64, sample: np.int64) -> int:
    """The run of the placed sample that gives way to the deferred one at position ``k`` (sample ``sample``):
    of the runs whose newest placed sample is newer than it, with at least its length and patches, the one of
    least length, then fewest patches; -1 where there is none."""
    patches = patches_of(cands, grid, k)
    leaf = runs.count - 1 - runs.of[k]
    while leaf < runs.count:
        leaf = leftmost_above(runs.newest, runs.leaves, leaf, sample)
        if leaf < 0:
            return -1
        g = runs.count - 1 - leaf
        if patches_of(cands, grid, runs.by_room[runs.start[g]]) >= patches:
            return g
        leaf += 1  # longer, but with fewer patches: it could not take this one's place
    return -1


@kernel
def starvation_safe(cands: Candidates, grid: Grid, at: np.ndarray) -> bool:
    """Whether no deferred candidate has a newer placed one that could take its place (later samples are
    not candidates: they are deferred and newer than every candidate)."""
    runs = _runs(cands, grid, at)
    k = 0
    while k < at.shape[0] and (at[k] >= 0 or _giving_way(cands, grid, runs, k, cands.order[k]) < 0):
        k += 1
    return k == at.shape[0]


@kernel
def prefer_older(cands: Candidates, plan: Placement, grid: Grid) -> int:
    """Swap deferred samples into the places of newer placed samples that could take theirs, in place, oldest
    deferred sample first, until no deferred sample has such a newer placed one. Each swap takes the one of
    least length, then fewest patches (the newest among equals), so the tokens and patches of the micro-batch
    can only fall (its cost too, with tokens only); the sample that gives way is newer and may in turn take
    another's place. Returns the number of swaps; none on a plan that is safe already."""
    n = cands.order.shape[0]
    runs = _runs(cands, grid, plan.at)
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
        g = _giving_way(cands, grid, runs, k, i)
        if g >= 0:
            gives_way = _swap(cands, plan, grid, runs, k, g)
            waiting[cands.order[gives_way]] = gives_way + 1  # newer than ``i``: its turn comes later
            swaps += 1
    return swaps


@kernel
def _swap(cands: Candidates, plan: Placement, grid: Grid, runs: Runs, k: int, h: int) -> int:
    """Put the deferred sample at position ``k`` in the place of run ``h``'s newest placed sample, which is
    deferred instead; returns that one's position."""
    kj = runs.by_room[runs.top[h]]
    slot = plan.at[kj]
    flat = flat_slot(grid, slot)
    tokens = np.int64(cands.length[k]) - np.int64(cands.length[kj])
    move_tokens(plan, slot >> grid.shift, flat, tokens, cands.cost[k] - cands.cost[kj])
    if grid.patch_capacity > 0:
        plan.patches[flat] += cands.patches[k] - cands.patches[kj]
    plan.at[k] = slot
    plan.at[kj] = -1
    previous = runs.top[h] - 1
    while previous >= runs.start[h] and plan.at[runs.by_room[previous]] < 0:
        previous -= 1
    runs.top[h] = previous
    newest = cands.order[runs.by_room[previous]] if previous >= runs.start[h] else -1
    set_leaf(runs.newest, runs.leaves, runs.count - 1 - h, newest)
    return kj
