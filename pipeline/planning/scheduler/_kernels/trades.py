"""The passes that even out the ranks of a plan by trades: exchanges of two placed samples between ranks, with
two capacities; the total cost evened out, and the vision encoder's part of it.

A multimodal step's micro-batches are often full in tokens or in patches, and then no sample can move to a
cheaper rank (``rebalance``); two samples can still trade places, each into the other's micro-batch where
both capacities allow. Only exchanges: what is placed, hence fill, the lower bound and the guarantee
against starvation, stays as it is.

A pass evens out one load (the total cost, the encoder's part or the LLM's) under caps on the others:
while the rank of most load is above the target, it trades with one of the ranks of least load the pair
whose difference of load is nearest half their gap, below it (both end below the larger), where neither
rank's other loads then pass their caps (the largest of each as it was when the pass began). So no capped
maximum ever rises.

Balancing the total alone leaves the encoder part uneven (a rank of images, another of text at the same
total), and once the total is even no trade can move encoder cost; so the encoder's pass comes first,
while the totals still leave room (to within ``FIRST_ENCODER_TOLERANCE``, which leaves the total's pass
room under the encoder's maximum), then the total's, then the encoder's again. Where the total and the
encoder part are even, so is the LLM's; where samples that fill their micro-batch keep the encoder part
uneven, the LLM's is too, and a last pass evens it out under caps on both the total and the encoder part
(a ``Pass``'s third load), so that neither of their maxima rises (with FSDP each part's layers wait for the
slowest rank of that part, so a step takes about the largest encoder part plus the largest LLM part).
Last, micro-batch swaps (``swaps.py``) even out the encoder's part and then the LLM's where single exchanges
cannot: samples that fill their micro-batches, piled on a few ranks. Without encoder costs, only the total's pass
runs.

**The pair search.** A pair trades only where its difference of value lies within the ranks' gap, and
where each sample fits the other's rank: about as long as the one it replaces, to within the most room of a
micro-batch there, and likewise in patches. Each rank's samples are kept sorted by the pass's value
(``ByValue``), so a sample's partners within the gap are a window of the partner rank's order, which only
moves one way as the rank's own samples are taken by rising value; within it the sizes are tested first,
then the caps and the micro-batches. At 256 ranks about one pair in four lies within the gap and a few in a
hundred of those have the sizes to fit. The answer is the pair a test of every pair in member order finds.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.kernels.trees import MinTree, new_min_tree, rekey_pair, restore_keys, set_key
from pipeline.planning.scheduler._kernels.state import Candidates, Grid, Pass, Placement, flat_slot, move_tokens
from pipeline.planning.scheduler._kernels.swaps import swap_micro_batches

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


class ByValue(NamedTuple):
    """Each rank's positions in ``Members.member`` sorted by their sample's value in a pass: rank ``r``'s are
    ``at[begin[r] : begin[r + 1]]`` (``Members.begin``), their values ``value`` alike."""

    at: np.ndarray
    value: np.ndarray


@kernel
def by_value_of(members: Members, values: np.ndarray, ranks: int) -> ByValue:
    index = ByValue(np.empty_like(members.member), np.empty(members.member.shape[0]))
    for r in range(ranks):
        sort_rank(members, values, index, r)
    return index


@kernel
def sort_rank(members: Members, values: np.ndarray, index: ByValue, r: int) -> None:
    """Sort rank ``r``'s part of ``index`` again, as its members are now. In place."""
    lo, hi = members.begin[r], members.begin[r + 1]
    held = np.empty(hi - lo)
    for y in range(lo, hi):
        held[y - lo] = values[members.member[y]]
    order = np.argsort(held, kind="mergesort")
    for t in range(hi - lo):
        index.at[lo + t] = lo + order[t]
        index.value[lo + t] = held[order[t]]


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


@kernel(inline="always")
def _most_room(plan: Placement, grid: Grid, r: int) -> tuple[int, int]:
    """The most free tokens and the most free patches of any micro-batch of rank ``r``."""
    tokens, patches = np.int64(0), np.int64(0)
    for slot in range(r * grid.micro, (r + 1) * grid.micro):
        tokens = max(tokens, grid.capacity - plan.tokens[slot])
        patches = max(patches, grid.patch_capacity - plan.patches[slot])
    return tokens, patches


@kernel
def _nearest_pair(
    cands: Candidates,
    plan: Placement,
    grid: Grid,
    members: tuple[Members, ByValue],
    ranks: tuple[int, int],
    balance: Pass,
) -> tuple[int, int, int, int]:
    """Positions ``(i, j)`` of rank ``a``'s and rank ``b``'s samples (``ranks``) that may trade places,
    whose difference of ``balance.value`` is nearest half the ranks' gap, below it, with neither rank's
    other load then above ``balance.cap``, and where each goes (``_targets``); all -1 where no pair scores
    above 0. Of pairs that score the same, the first of ``a``'s samples in member order wins, then the first
    of ``b``'s. Only ``b``'s samples within the gap are tried (``ByValue``), and of those, first, whether
    they could fit: ``i`` fits on ``b`` only where ``length[i] <= length[j] + room_b`` and ``j`` on ``a``
    only where ``length[j] <= length[i] + room_a``, likewise for patches."""
    held, index = members
    a, b = ranks
    gap = balance.load[a] - balance.load[b]
    room_a, room_b = _most_room(plan, grid, a), _most_room(plan, grid, b)
    lo_b, hi_b = held.begin[b], held.begin[b + 1]
    best_i, best_j, best_score, best_x, best_y = -1, -1, 0.0, -1, -1
    best_to = (-1, -1)
    first, last = lo_b, lo_b  # b's window, which only moves right as a's samples go by rising value
    for u in range(held.begin[a], held.begin[a + 1]):
        x = index.at[u]
        i = held.member[x]
        length_i, patches_i, value_i = np.int64(cands.length[i]), cands.patches[i], index.value[u]
        while first < hi_b and value_i - index.value[first] >= gap:
            first += 1
        last = max(last, first)
        while last < hi_b and value_i - index.value[last] > 0.0:
            last += 1
        for t in range(first, last):
            y = index.at[t]
            j = held.member[y]
            length_j, patches_j = np.int64(cands.length[j]), cands.patches[j]
            if length_i - length_j > room_b[0] or length_j - length_i > room_a[0]:
                continue
            if patches_i - patches_j > room_b[1] or patches_j - patches_i > room_a[1]:
                continue
            d = value_i - index.value[t]
            score = min(d, gap - d)
            if score < best_score or (score == best_score and (x > best_x or (x == best_x and y > best_y))):
                continue
            shift = balance.other_value[i] - balance.other_value[j]
            if balance.other[a] - shift > balance.cap or balance.other[b] + shift > balance.cap:
                continue
            shift = balance.third_value[i] - balance.third_value[j]
            if balance.third[a] - shift > balance.third_cap or balance.third[b] + shift > balance.third_cap:
                continue
            to = _targets(cands, plan, grid, i, j)
            if to[0] >= 0 and to[1] >= 0:
                best_i, best_j, best_score, best_x, best_y, best_to = i, j, score, x, y, to
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
    cands: Candidates,
    plan: Placement,
    grid: Grid,
    members: tuple[Members, ByValue],
    balance: Pass,
    trees: tuple[MinTree, MinTree],
    tries: int,
) -> bool:
    """One exchange of the rank of most load with the first of its ``tries`` partners of least load that one
    suits (``trees``: least load first, most load first); whether one was made."""
    least, most = trees
    a = most.ids[0]
    skipped = np.empty(tries, np.int64)
    n_skipped = 0
    traded = False
    while n_skipped < tries:
        b = least.ids[0]
        if least.keys[0] == np.inf or balance.load[a] - balance.load[b] <= 0.0:
            break
        trade = _nearest_pair(cands, plan, grid, members, (a, b), balance)
        if trade[0] < 0:
            set_key(least, b, np.inf)  # no use to this rank; try the next
            skipped[n_skipped] = b
            n_skipped += 1
            continue
        _exchange(cands, plan, grid, members[0], trade)
        for r in (a, b):
            sort_rank(members[0], balance.value, members[1], r)
        i, j = trade[0], trade[1]
        moved = (balance.load, balance.value), (balance.other, balance.other_value)
        for load, value in (*moved, (balance.third, balance.third_value)):
            load[a] -= value[i] - value[j]
            load[b] += value[i] - value[j]
        rekey_pair(least, most, (a, b), balance.load)
        traded = True
        break
    restore_keys(least, skipped, n_skipped, balance.load)
    return traded


@kernel
def even_out(
    cands: Candidates,
    plan: Placement,
    grid: Grid,
    members: Members,
    balance: Pass,
    target: float,
    limits: tuple[int, int],
) -> int:
    """Exchanges while the rank of most ``balance.load`` is above ``target``; returns how many. In place
    (``balance.load`` too). ``limits``: the most exchanges, and the partners tried for one (``_trade``)."""
    max_trades, tries = limits
    index = by_value_of(members, balance.value, grid.ranks)
    least, most = new_min_tree(grid.ranks), new_min_tree(grid.ranks)
    for r in range(grid.ranks):
        set_key(least, r, balance.load[r])
        set_key(most, r, -balance.load[r])
    trades = 0
    while trades < max_trades and balance.load[most.ids[0]] > target:
        if not _trade(cands, plan, grid, (members, index), balance, (least, most), tries):
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
    sample_llm = cands.cost - sample_encoder
    largest, largest_encoder, largest_llm = 0.0, 0.0, 0.0
    for k in range(n):
        if plan.at[k] >= 0:
            encoder[plan.at[k] >> grid.shift] += sample_encoder[k]
            largest, largest_encoder = max(largest, cands.cost[k]), max(largest_encoder, sample_encoder[k])
            largest_llm = max(largest_llm, sample_llm[k])
    total_target = (1 + tolerance) * max(total.sum() / grid.ranks, largest)
    encoder_bound = max(encoder.sum() / grid.ranks, largest_encoder)
    limits = (4 * grid.ranks + 64, _TRADE_TRIES)
    free, free_value = np.zeros(grid.ranks), np.zeros(n)  # a third load no trade is held to
    if has_encoder:
        by_encoder = Pass(encoder, sample_encoder, total, cands.cost, total.max(), free, free_value, np.inf)
        first_target = (1 + max(tolerance, FIRST_ENCODER_TOLERANCE)) * encoder_bound
        even_out(cands, plan, grid, members, by_encoder, first_target, limits)
    by_total = Pass(total, cands.cost, encoder, sample_encoder, encoder.max(), free, free_value, np.inf)
    even_out(cands, plan, grid, members, by_total, total_target, limits)
    if has_encoder:
        by_encoder = Pass(encoder, sample_encoder, total, cands.cost, total.max(), free, free_value, np.inf)
        even_out(cands, plan, grid, members, by_encoder, (1 + tolerance) * encoder_bound, limits)
        llm = total - encoder
        llm_target = (1 + tolerance) * max(llm.sum() / grid.ranks, largest_llm)
        by_llm = Pass(llm, sample_llm, total, cands.cost, total.max(), encoder, sample_encoder, encoder.max())
        even_out(cands, plan, grid, members, by_llm, llm_target, limits)
        by_encoder = Pass(encoder, sample_encoder, total, cands.cost, total.max(), llm, sample_llm, llm.max())
        swap_micro_batches(cands, plan, grid, by_encoder, (1 + tolerance) * encoder_bound, limits)
        by_llm = Pass(llm, sample_llm, total, cands.cost, total.max(), encoder, sample_encoder, encoder.max())
        swap_micro_batches(cands, plan, grid, by_llm, llm_target, limits)
