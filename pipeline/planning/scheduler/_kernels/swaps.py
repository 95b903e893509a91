"""Micro-batch swaps: two ranks exchange the whole contents of one micro-batch each, where exchanging single
samples (``trades.py``) cannot even out a part.

A micro-batch that one sample fills (a text as long as a micro-batch) can trade places only with a sample as
long, so the samples that fill micro-batches can end up together on a few ranks (two on one rank, none on
another): those ranks hold much of the LLM's part and little of the encoder's, and no exchange of single
samples moves them apart. Exchanging the whole micro-batch does, and keeps both capacities of every
micro-batch (each moves whole into a micro-batch of the same size) and what is placed.

A pass evens out one load (a ``Pass``'s) under caps on the two others, as a trade pass does: while the rank of
most load is above the target, it exchanges with one of the ``tries`` ranks of least load the pair of
micro-batches whose difference of load is nearest half their gap, below it, where neither rank's other loads
then pass their caps; so no capped maximum rises. Micro-batches that hold more than candidates (what the step
held before them: a context-parallel step's blocks) are never exchanged.
"""

from __future__ import annotations

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.scheduler._kernels.state import Candidates, Grid, Pass, Placement, flat_slot


@kernel
def _slot_sums(cands: Candidates, plan: Placement, grid: Grid, balance: Pass) -> tuple:
    """Per micro-batch (flat): the sums of the pass's three values over its candidates, and whether it holds
    nothing but candidates."""
    slots = grid.ranks * grid.micro
    load, other, third = np.zeros(slots), np.zeros(slots), np.zeros(slots)
    tokens = np.zeros(slots, np.int64)
    for k in range(plan.at.shape[0]):
        if plan.at[k] >= 0:
            s = flat_slot(grid, plan.at[k])
            load[s] += balance.value[k]
            other[s] += balance.other_value[k]
            third[s] += balance.third_value[k]
            tokens[s] += np.int64(cands.length[k])
    return load, other, third, tokens == plan.tokens


@kernel
def _best_pair(sums: tuple, grid: Grid, balance: Pass, a: int, b: int) -> tuple[int, int]:
    """Micro-batches (flat) of ranks ``a`` and ``b`` whose exchange lowers ``a``'s load nearest half their gap,
    neither rank's capped loads passing their caps; (-1, -1) where none."""
    load, other, third, own = sums
    gap = balance.load[a] - balance.load[b]
    best, best_x, best_y = 0.0, -1, -1
    for x in range(a * grid.micro, (a + 1) * grid.micro):
        if not own[x]:
            continue
        for y in range(b * grid.micro, (b + 1) * grid.micro):
            if not own[y]:
                continue
            d = load[x] - load[y]
            if d <= 0.0 or d >= gap or min(d, gap - d) <= best:
                continue
            shift = other[x] - other[y]
            if balance.other[a] - shift > balance.cap or balance.other[b] + shift > balance.cap:
                continue
            shift = third[x] - third[y]
            if balance.third[a] - shift > balance.third_cap or balance.third[b] + shift > balance.third_cap:
                continue
            best, best_x, best_y = min(d, gap - d), x, y
    return best_x, best_y


@kernel
def _exchange(cands: Candidates, plan: Placement, grid: Grid, sums: tuple, balance: Pass, pair: tuple) -> None:
    """Micro-batches ``x`` and ``y`` (flat) exchange their candidates, totals and sums. In place."""
    load, other, third = sums[0], sums[1], sums[2]
    x, y = pair
    a, b = x // grid.micro, y // grid.micro
    to_y = (np.int64(b) << grid.shift) | np.int64(y % grid.micro)
    to_x = (np.int64(a) << grid.shift) | np.int64(x % grid.micro)
    for k in range(plan.at.shape[0]):
        if plan.at[k] >= 0:
            s = flat_slot(grid, plan.at[k])
            if s == x:
                plan.at[k] = to_y
            elif s == y:
                plan.at[k] = to_x
    plan.rank_cost[a] += plan.micro_cost[y] - plan.micro_cost[x]
    plan.rank_cost[b] += plan.micro_cost[x] - plan.micro_cost[y]
    for per_slot in (load, other, third):
        per_slot[x], per_slot[y] = per_slot[y], per_slot[x]
    for rank_loads, per_slot in ((balance.load, load), (balance.other, other), (balance.third, third)):
        rank_loads[a] += per_slot[x] - per_slot[y]  # x now holds what y held
        rank_loads[b] += per_slot[y] - per_slot[x]
    plan.tokens[x], plan.tokens[y] = plan.tokens[y], plan.tokens[x]
    plan.micro_cost[x], plan.micro_cost[y] = plan.micro_cost[y], plan.micro_cost[x]
    plan.patches[x], plan.patches[y] = plan.patches[y], plan.patches[x]


@kernel
def swap_micro_batches(
    cands: Candidates, plan: Placement, grid: Grid, balance: Pass, target: float, limits: tuple[int, int]
) -> int:
    """Exchanges while the rank of most ``balance.load`` is above ``target``; returns how many. In place
    (``balance``'s loads too). ``limits``: the most exchanges, and the ranks of least load tried for one."""
    max_swaps, tries = limits
    sums = _slot_sums(cands, plan, grid, balance)
    swaps = 0
    while swaps < max_swaps:
        a = int(np.argmax(balance.load))
        if balance.load[a] <= target:
            break
        pair = (-1, -1)
        for b in np.argsort(balance.load, kind="mergesort")[:tries]:
            if balance.load[b] >= balance.load[a]:
                break
            pair = _best_pair(sums, grid, balance, a, int(b))
            if pair[0] >= 0:
                break
        if pair[0] < 0:
            break
        _exchange(cands, plan, grid, sums, balance, pair)
        swaps += 1
    return swaps
