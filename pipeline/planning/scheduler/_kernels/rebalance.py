"""The passes that even out the ranks of a plan without changing what it places: moves of samples from the
costliest ranks, and, with two capacities, trades of two samples between ranks.

**Moves.** Refinement restricted to the costliest ranks: placed samples move from them to the cheapest ranks.

Only moves: the set of placed samples, hence the lower bound and the guarantee against starvation,
stays as it is, and every move lowers the larger of the two ranks it touches. With two capacities a sample
moves only into a micro-batch with room for its tokens and its patches.

**Trades.** Exchanges of two placed samples between ranks, with two capacities: the total cost evened out, and the
vision encoder's part of it.

A multimodal step's micro-batches are often full in tokens or in patches, and then no sample can move to a
cheaper rank (the moves above); two samples can still trade places, each into the other's micro-batch where
both capacities allow. Only exchanges: what is placed, hence fill, the lower bound and the guarantee
against starvation, stays as it is.

A pass evens out one load (the total cost, or the encoder's part) under a cap on the other: while the rank
of most load is above the target, it trades with one of the ranks of least load the pair whose difference
of load is nearest half their gap, below it (both end below the larger), where neither rank's other load
then passes the largest other load as it was when the pass began. So neither maximum ever rises.

Balancing the total alone leaves the encoder part uneven (a rank of images, another of text at the same
total), and once the total is even no trade can move encoder cost; so the encoder's pass comes first,
while the totals still leave room (to within ``FIRST_ENCODER_TOLERANCE``, which leaves the total's pass
room under the encoder's maximum), then the total's, then the encoder's again. Where the total and the
encoder part are even, so is the LLM's. Without encoder costs, only the total's pass runs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.kernels.trees import MinTree, first_fit, new_min_tree, set_key
from pipeline.planning.scheduler._kernels.state import (
    Candidates,
    Grid,
    Placement,
    flat_slot,
    least_costly_fit,
    move_patches,
    move_tokens,
    patches_of,
    place,
    rooms,
)

# Cheapest ranks tried for one costly rank before giving up on it.
_MOVE_TRIES = 8


class ByCost(NamedTuple):
    """The ranks cheapest first and costliest first (keyed by minus the cost), and room for the ranks
    taken out of ``cheapest`` while one costly rank tries them."""

    cheapest: MinTree
    costliest: MinTree
    skipped: np.ndarray


class Givers(NamedTuple):
    """The positions of the samples that may move, contiguous by rank: rank ``r``'s are
    ``member[begin[r] : begin[r] + count[r]]``."""

    begin: np.ndarray
    count: np.ndarray
    member: np.ndarray


@kernel
def move_from_costliest(cands: Candidates, plan: Placement, grid: Grid, target: float, max_moves: int) -> int:
    """While the costliest rank is above ``target``, move one of its samples to one of the cheapest ranks
    with room: the sample whose cost is nearest half their difference, below it. Only the samples of ranks
    above ``target`` at the start move, each at most once. In place; returns the moves."""
    givers = _givers(plan, grid, target)
    by_cost = ByCost(new_min_tree(grid.ranks), new_min_tree(grid.ranks), np.empty(_MOVE_TRIES, np.int64))
    for r in range(grid.ranks):
        set_key(by_cost.cheapest, r, plan.rank_cost[r])
        set_key(by_cost.costliest, r, -plan.rank_cost[r])
    moves = 0
    while moves < max_moves:
        a = by_cost.costliest.ids[0]
        if plan.rank_cost[a] <= target or not _give_away(cands, plan, grid, givers, a, by_cost):
            break
        moves += 1
    return moves


@kernel
def _givers(plan: Placement, grid: Grid, target: float) -> Givers:
    """The samples of the ranks above ``target`` (only those give samples away); empty for the others."""
    at, shift = plan.at, grid.shift
    begin = np.zeros(grid.ranks + 1, np.int64)
    for k in range(at.shape[0]):
        if at[k] >= 0 and plan.rank_cost[at[k] >> shift] > target:
            begin[(at[k] >> shift) + 1] += 1
    for r in range(grid.ranks):
        begin[r + 1] += begin[r]
    count = np.zeros(grid.ranks, np.int64)
    member = np.empty(begin[grid.ranks], np.int32)
    for k in range(at.shape[0]):
        if at[k] >= 0 and plan.rank_cost[at[k] >> shift] > target:
            r = at[k] >> shift
            member[begin[r] + count[r]] = k
            count[r] += 1
    return Givers(begin, count, member)


@kernel
def _give_away(cands: Candidates, plan: Placement, grid: Grid, givers: Givers, a: int, by_cost: ByCost) -> bool:
    """Move one sample of rank ``a`` to the first of its ``_MOVE_TRIES`` cheapest ranks that one suits; whether
    one moved. The ranks tried in vain are out of ``cheapest`` while the others are tried."""
    cheapest, skipped = by_cost.cheapest, by_cost.skipped
    n_skipped = 0
    moved = False
    while n_skipped < _MOVE_TRIES:
        b = cheapest.ids[0]
        gap = plan.rank_cost[a] - plan.rank_cost[b]
        if cheapest.keys[0] == np.inf or gap <= 0.0:
            break
        best = _nearest_half(cands, plan, grid, givers, a, b, gap)
        if best < 0:
            set_key(cheapest, b, np.inf)  # no use to this rank; try the next
            skipped[n_skipped] = b
            n_skipped += 1
            continue
        _move(cands, plan, grid, givers, a, b, best)
        for r in (a, b):
            set_key(cheapest, r, plan.rank_cost[r])
            set_key(by_cost.costliest, r, -plan.rank_cost[r])
        moved = True
        break
    for t in range(n_skipped):
        set_key(cheapest, skipped[t], plan.rank_cost[skipped[t]])
    return moved


@kernel
def _nearest_half(cands: Candidates, plan: Placement, grid: Grid, givers: Givers, a: int, b: int, gap: float) -> int:
    """The slot in ``givers`` of rank ``a``'s sample that fits a micro-batch of rank ``b`` whose cost is
    nearest half of ``gap``, below ``gap``; -1 where none scores above 0."""
    base_b = b * grid.micro
    room = grid.capacity - plan.tokens[base_b : base_b + grid.micro].min()
    slots = rooms(plan, grid)
    best, best_score = -1, -1.0
    for slot in range(givers.begin[a], givers.begin[a] + givers.count[a]):
        k = givers.member[slot]
        cost = cands.cost[k]
        if cands.length[k] <= room and cost < gap:
            score = min(cost, gap - cost)
            if score > best_score and (
                grid.patch_capacity == 0 or first_fit(slots, b, cands.length[k], cands.patches[k]) >= 0
            ):
                best, best_score = slot, score
    return best if best_score > 0.0 else -1


@kernel
def _move(cands: Candidates, plan: Placement, grid: Grid, givers: Givers, a: int, b: int, slot: int) -> None:
    """Move the sample at ``slot`` of ``givers`` from rank ``a`` to rank ``b``'s least costly micro-batch with
    room. A moved sample is not moved again: it leaves its list and joins none."""
    last = givers.begin[a] + givers.count[a] - 1
    k = givers.member[slot]
    givers.member[slot] = givers.member[last]
    givers.count[a] -= 1
    move_tokens(plan, a, flat_slot(grid, plan.at[k]), -np.int64(cands.length[k]), -cands.cost[k])
    move_patches(plan, grid, flat_slot(grid, plan.at[k]), cands, k, -1)
    place(
        cands, plan, grid, k, b, least_costly_fit(plan, grid, b, np.int64(cands.length[k]), patches_of(cands, grid, k))
    )


# Partner ranks tried for one rank before giving up on it.
_TRADE_TRIES = 32
# The first pass over the encoder's part stops this far above its lower bound: the total's pass after it
# needs room under the encoder's maximum to trade, and the last encoder pass gets nearer.
FIRST_ENCODER_TOLERANCE = 0.01


class Members(NamedTuple):
    """The positions of the placed samples, contiguous by rank: rank ``r``'s are ``member[begin[r] :
    begin[r + 1]]``; ``where[k]`` is position ``k``'s index in ``member``. Exchanges keep every rank's count."""

    begin: np.ndarray
    member: np.ndarray
    where: np.ndarray


class Pass(NamedTuple):
    """What one pass evens out: each rank's ``load`` and each position's ``value`` (cost, or encoder cost);
    the other load by rank and position, and the most of it a rank may hold (``cap``)."""

    load: np.ndarray
    value: np.ndarray
    other: np.ndarray
    other_value: np.ndarray
    cap: float


@kernel
def members_of(plan: Placement, grid: Grid) -> Members:
    at, shift = plan.at, grid.shift
    begin = np.zeros(grid.ranks + 1, np.int64)
    for k in range(at.shape[0]):
        if at[k] >= 0:
            begin[(at[k] >> shift) + 1] += 1
    for r in range(grid.ranks):
        begin[r + 1] += begin[r]
    member = np.empty(begin[grid.ranks], np.int64)
    where = np.full(at.shape[0], -1, np.int64)
    filled = begin[:-1].copy()
    for k in range(at.shape[0]):
        if at[k] >= 0:
            r = at[k] >> shift
            member[filled[r]] = k
            where[k] = filled[r]
            filled[r] += 1
    return Members(begin, member, where)


@kernel(inline="always")
def _slot_for(plan: Placement, grid: Grid, leaving: np.int64, k_out: tuple[int, int], k_in: tuple[int, int]) -> int:
    """The micro-batch (flat) of the rank of micro-batch ``leaving`` that has room for a sample of ``k_in``
    (tokens, patches) once the one of ``k_out`` leaves ``leaving``: that one first, then the first with
    room; -1 where none has."""
    base = leaving - leaving % grid.micro
    for m in range(-1, grid.micro):
        slot = leaving if m < 0 else base + m
        if m >= 0 and slot == leaving:
            continue
        freed = slot == leaving
        tokens = plan.tokens[slot] - (k_out[0] if freed else 0) + k_in[0]
        patches = plan.patches[slot] - (k_out[1] if freed else 0) + k_in[1]
        if tokens <= grid.capacity and patches <= grid.patch_capacity:
            return slot
    return -1


@kernel(inline="always")
def _sizes(cands: Candidates, k: np.int64) -> tuple[int, int]:
    return np.int64(cands.length[k]), cands.patches[k]


@kernel(inline="always")
def _targets(cands: Candidates, plan: Placement, grid: Grid, i: np.int64, j: np.int64) -> tuple[int, int]:
    """Where samples ``i`` and ``j`` go if they trade ranks (flat micro-batches: ``i``'s on ``j``'s rank,
    ``j``'s on ``i``'s), both capacities kept; -1 for a side without room."""
    si, sj = flat_slot(grid, plan.at[i]), flat_slot(grid, plan.at[j])
    return (
        _slot_for(plan, grid, sj, _sizes(cands, j), _sizes(cands, i)),
        _slot_for(plan, grid, si, _sizes(cands, i), _sizes(cands, j)),
    )


@kernel
def _nearest_pair(
    cands: Candidates, plan: Placement, grid: Grid, members: Members, ranks: tuple[int, int], balance: Pass
) -> tuple[int, int, int, int]:
    """Positions ``(i, j)`` of rank ``a``'s and rank ``b``'s samples (``ranks``) that may trade places,
    whose difference of ``balance.value`` is nearest half the ranks' gap, below it, with neither rank's
    other load then above ``balance.cap``, and where each goes (``_targets``); all -1 where no pair scores
    above 0."""
    a, b = ranks
    gap = balance.load[a] - balance.load[b]
    best_i, best_j, best_score = -1, -1, 0.0
    best_to = (-1, -1)
    for x in range(members.begin[a], members.begin[a + 1]):
        i = members.member[x]
        for y in range(members.begin[b], members.begin[b + 1]):
            j = members.member[y]
            d = balance.value[i] - balance.value[j]
            if d <= 0.0 or d >= gap or min(d, gap - d) <= best_score:
                continue
            shift = balance.other_value[i] - balance.other_value[j]
            if balance.other[a] - shift > balance.cap or balance.other[b] + shift > balance.cap:
                continue
            to = _targets(cands, plan, grid, i, j)
            if to[0] >= 0 and to[1] >= 0:
                best_i, best_j, best_score, best_to = i, j, min(d, gap - d), to
    return best_i, best_j, best_to[0], best_to[1]


@kernel
def _exchange(
    cands: Candidates, plan: Placement, grid: Grid, members: Members, trade: tuple[int, int, int, int]
) -> None:
    """Samples ``i`` and ``j`` trade ranks, into micro-batches ``ti`` and ``tj`` (flat). In place."""
    i, j, ti, tj = trade
    for k, to in ((i, ti), (j, tj)):
        slot = flat_slot(grid, plan.at[k])
        move_tokens(plan, slot // grid.micro, slot, -np.int64(cands.length[k]), -cands.cost[k])
        plan.patches[slot] -= cands.patches[k]
        move_tokens(plan, to // grid.micro, to, np.int64(cands.length[k]), cands.cost[k])
        plan.patches[to] += cands.patches[k]
        plan.at[k] = ((to // grid.micro) << grid.shift) | (to % grid.micro)
    wi, wj = members.where[i], members.where[j]
    members.member[wi], members.member[wj] = j, i
    members.where[i], members.where[j] = wj, wi


@kernel
def _trade(
    cands: Candidates, plan: Placement, grid: Grid, members: Members, balance: Pass, trees: tuple[MinTree, MinTree]
) -> bool:
    """One exchange of the rank of most load with the first of its ``_TRADE_TRIES`` partners of least load that one
    suits (``trees``: least load first, most load first); whether one was made."""
    least, most = trees
    a = most.ids[0]
    skipped = np.empty(_TRADE_TRIES, np.int64)
    n_skipped = 0
    traded = False
    while n_skipped < _TRADE_TRIES:
        b = least.ids[0]
        if least.keys[0] == np.inf or balance.load[a] - balance.load[b] <= 0.0:
            break
        trade = _nearest_pair(cands, plan, grid, members, (a, b), balance)
        if trade[0] < 0:
            set_key(least, b, np.inf)  # no use to this rank; try the next
            skipped[n_skipped] = b
            n_skipped += 1
            continue
        _exchange(cands, plan, grid, members, trade)
        i, j = trade[0], trade[1]
        for load, value in ((balance.load, balance.value), (balance.other, balance.other_value)):
            load[a] -= value[i] - value[j]
            load[b] += value[i] - value[j]
        for r in (a, b):
            set_key(least, r, balance.load[r])
            set_key(most, r, -balance.load[r])
        traded = True
        break
    for t in range(n_skipped):
        set_key(least, skipped[t], balance.load[skipped[t]])
    return traded


@kernel
def even_out(
    cands: Candidates, plan: Placement, grid: Grid, members: Members, balance: Pass, target: float, max_trades: int
) -> int:
    """Exchanges while the rank of most ``balance.load`` is above ``target``; returns how many. In place
    (``balance.load`` too)."""
    least, most = new_min_tree(grid.ranks), new_min_tree(grid.ranks)
    for r in range(grid.ranks):
        set_key(least, r, balance.load[r])
        set_key(most, r, -balance.load[r])
    trades = 0
    while trades < max_trades and balance.load[most.ids[0]] > target:
        if not _trade(cands, plan, grid, members, balance, (least, most)):
            break
        trades += 1
    return trades


@kernel
def trade_places(cands: Candidates, plan: Placement, grid: Grid, tolerance: float) -> None:
    """The passes (see the module docstring), each until its rank of most load is within ``tolerance`` of its
    lower bound (mean over ranks, or the largest sample's), or no exchange helps. In place."""
    members = members_of(plan, grid)
    n = plan.at.shape[0]
    has_encoder = cands.encoder.shape[0] > 0
    total, encoder = plan.rank_cost.copy(), np.zeros(grid.ranks)
    sample_encoder = cands.encoder if has_encoder else np.zeros(n)
    largest, largest_encoder = 0.0, 0.0
    for k in range(n):
        if plan.at[k] >= 0:
            encoder[plan.at[k] >> grid.shift] += sample_encoder[k]
            largest, largest_encoder = max(largest, cands.cost[k]), max(largest_encoder, sample_encoder[k])
    total_target = (1 + tolerance) * max(total.sum() / grid.ranks, largest)
    encoder_bound = max(encoder.sum() / grid.ranks, largest_encoder)
    most = 4 * grid.ranks + 64
    if has_encoder:
        by_encoder = Pass(encoder, sample_encoder, total, cands.cost, total.max())
        first_target = (1 + max(tolerance, FIRST_ENCODER_TOLERANCE)) * encoder_bound
        even_out(cands, plan, grid, members, by_encoder, first_target, most)
    by_total = Pass(total, cands.cost, encoder, sample_encoder, encoder.max())
    even_out(cands, plan, grid, members, by_total, total_target, most)
    if has_encoder:
        by_encoder = Pass(encoder, sample_encoder, total, cands.cost, total.max())
        even_out(cands, plan, grid, members, by_encoder, (1 + tolerance) * encoder_bound, most)
