"""The plan of one step in one numba kernel: plain LPT, made starvation-safe two ways, the better kept.

1. Plain LPT over the candidates (``_lpt.py``). It may defer an old sample while it places a newer one at
   least as long, which the scheduler never does.
2. The reference: that plan with the swap repair (``_repair.py``), the starvation-safe LPT. The plan
   returned is never worse than it on fill (tokens placed) nor on balance (costliest rank over the lower
   bound of what is placed): ``score``.
3. *Held back*: the LPT plan without the newest candidates holding ``RESERVE`` of the step's tokens (or
   the tokens LPT deferred, where more); then every deferred candidate, oldest first, goes where there is
   room without lifting a rank above LPT's costliest (``_topup.py``); the swap repair where an older one
   is still deferred for a newer one. The samples that wait are then the newest ones rather than LPT's
   shortest, and the repair's swaps (which cost fill) are few.
4. The held-back plan where it is at least as good as the reference on both; else the reference with its
   deferred samples, oldest first, put where there is room without lifting its costliest rank, which
   raises fill and the lower bound and leaves the costliest rank as it is.
5. Where the caller gives a ``start`` (a placement of its own, such as step composition's packing of the
   micro-batches' holes), it is completed like the reference (its deferred samples, oldest first, where
   there is room without lifting its costliest rank; then starvation-safe) and kept instead where it
   scores higher on balance times fill (``balance_fill``): a fixed set of samples can pack worse than
   the placement it was chosen for.
6. Samples move from the costliest ranks to the cheapest while the costliest is more than ``tolerance``
   above the lower bound (``_refine.py``): the costliest rank only falls, what is placed stays.

numba's on-disk cache (``cache=True``) recompiles ``plan_kernel`` when this file changes, not when a module
it calls does: after editing one, delete ``pipeline/planning/scheduler/__pycache__/*.nbi`` and ``*.nbc``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pipeline.planning.scheduler._lpt import by_index, lpt_kernel
from pipeline.planning.scheduler._refine import move_from_costliest
from pipeline.planning.scheduler._repair import deferred_oldest_first, prefer_older, starvation_safe
from pipeline.planning.scheduler._topup import top_up

# The held-back plan takes out the newest candidates holding this share of the step's tokens, or as many
# tokens as LPT deferred where that is more.
RESERVE = 0.002


@njit(cache=True)
def score(at: np.ndarray, sorted_cost: np.ndarray, rank_cost: np.ndarray, tokens: np.ndarray) -> tuple[np.int64, float]:
    """Tokens placed, and the costliest rank over the lower bound ``max(placed cost / ranks, largest placed
    cost)`` (1.0 when that is 0): ``PlanSummary``'s ``tokens_placed`` and ``balance_ratio``."""
    largest = 0.0
    for k in range(at.shape[0]):  # longest first: the first placed is the costliest
        if at[k] >= 0:
            largest = sorted_cost[k]
            break
    lower = max(rank_cost.sum() / rank_cost.shape[0], largest)
    return tokens.sum(), rank_cost.max() / lower if lower > 0.0 else 1.0


@njit(cache=True)
def at_least_as_good(plan: tuple[np.int64, float], reference: tuple[np.int64, float]) -> bool:
    """Whether a plan's ``score`` is no worse than the reference's on either."""
    return plan[0] >= reference[0] and plan[1] <= reference[1]


@njit(cache=True)
def balance_fill(rank_cost: np.ndarray, tokens: np.ndarray, capacity: int) -> float:
    """Mean over largest rank cost (1.0 when nothing costs) times the share of the step's tokens placed."""
    largest = rank_cost.max()
    balance = rank_cost.sum() / rank_cost.shape[0] / largest if largest > 0.0 else 1.0
    return balance * tokens.sum() / (np.float64(tokens.shape[0]) * capacity)


@njit(cache=True)
def _started(
    start: np.ndarray,
    order: np.ndarray,
    sorted_length: np.ndarray,
    sorted_cost: np.ndarray,
    like: np.ndarray,
    shift: int,
    n_ranks: int,
    n_micro: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The plan ``start`` gives (``rank * n_micro + m`` per sample, -1 for none) in sorted order: ``at`` (of
    ``like``'s type), the cost of every rank, the tokens and cost of every micro-batch."""
    at = np.full_like(like, -1)
    rank_cost = np.zeros(n_ranks, np.float64)
    tokens = np.zeros(n_ranks * n_micro, np.int64)
    micro_cost = np.zeros(n_ranks * n_micro, np.float64)
    for k in range(order.shape[0]):
        slot = start[order[k]]
        if slot >= 0:
            at[k] = ((slot // n_micro) << shift) | (slot % n_micro)
            tokens[slot] += sorted_length[k]
            micro_cost[slot] += sorted_cost[k]
            rank_cost[slot // n_micro] += sorted_cost[k]
    return at, rank_cost, tokens, micro_cost


@njit(cache=True)
def _fill(
    order: np.ndarray,
    sorted_length: np.ndarray,
    sorted_cost: np.ndarray,
    at: np.ndarray,
    shift: int,
    rank_cost: np.ndarray,
    tokens: np.ndarray,
    micro_cost: np.ndarray,
    capacity: int,
    cost_cap: float,
) -> None:
    """Place deferred samples, oldest first, where they fit without lifting a rank above ``cost_cap``, then
    make the plan starvation-safe. In place."""
    deferred = deferred_oldest_first(order, at)
    top_up(deferred, sorted_length, sorted_cost, at, shift, rank_cost, tokens, micro_cost, capacity, cost_cap)
    if not starvation_safe(order, sorted_length, at):
        prefer_older(order, sorted_length, sorted_cost, at, shift, rank_cost, tokens, micro_cost)


@njit(cache=True)
def _hold_back(
    lengths: np.ndarray,
    order: np.ndarray,
    sorted_length: np.ndarray,
    sorted_cost: np.ndarray,
    at: np.ndarray,
    shift: int,
    rank_cost: np.ndarray,
    tokens: np.ndarray,
    micro_cost: np.ndarray,
    reserve_tokens: np.int64,
) -> None:
    """Take the newest candidates holding at most ``reserve_tokens`` out of the plan, in place."""
    newest = order.shape[0]
    held = np.int64(0)
    while newest > 0 and held + lengths[newest - 1] <= reserve_tokens:
        newest -= 1
        held += lengths[newest]
    n_micro = tokens.shape[0] // rank_cost.shape[0]
    low_bits = (1 << shift) - 1
    for k in range(at.shape[0]):
        if order[k] >= newest and at[k] >= 0:
            r = at[k] >> shift
            slot = r * n_micro + (at[k] & low_bits)
            tokens[slot] -= sorted_length[k]
            micro_cost[slot] -= sorted_cost[k]
            rank_cost[r] -= sorted_cost[k]
            at[k] = -1


@njit(cache=True)
def plan_kernel(
    lengths: np.ndarray,
    costs: np.ndarray,
    n_ranks: int,
    n_micro: int,
    capacity: int,
    tolerance: float,
    at: np.ndarray,
    start: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Rank and micro-batch of every sample (int32, -1 when deferred). ``lengths`` are checked already and
    ``costs`` are theirs (``CostModel.costs``); ``at`` is scratch for ``lpt_kernel``; ``start`` a checked
    placement to start from (step 5), or empty."""
    order, sorted_length, sorted_cost, at, shift, rank_cost, tokens, micro_cost = lpt_kernel(
        lengths, costs, n_ranks, n_micro, capacity, at
    )
    sorted_plan = (order, sorted_length, sorted_cost)
    held_plan = (at.copy(), shift, rank_cost.copy(), tokens.copy(), micro_cost.copy())
    lpt_costliest = rank_cost.max()

    if not starvation_safe(order, sorted_length, at):
        prefer_older(*sorted_plan, at, shift, rank_cost, tokens, micro_cost)
    reference = score(at, sorted_cost, rank_cost, tokens)

    lpt_deferred = np.int64(0)
    for k in range(at.shape[0]):
        if held_plan[0][k] < 0:
            lpt_deferred += sorted_length[k]
    reserve_tokens = max(np.int64(RESERVE * np.float64(n_ranks) * n_micro * capacity), lpt_deferred)
    _hold_back(lengths, *sorted_plan, *held_plan, reserve_tokens)
    _fill(*sorted_plan, *held_plan, capacity, lpt_costliest)
    held_at, _, held_rank_cost, held_tokens, held_micro_cost = held_plan
    if at_least_as_good(score(held_at, sorted_cost, held_rank_cost, held_tokens), reference):
        at, rank_cost, tokens, micro_cost = held_at, held_rank_cost, held_tokens, held_micro_cost
    else:
        _fill(*sorted_plan, at, shift, rank_cost, tokens, micro_cost, capacity, rank_cost.max())

    if start.shape[0] > 0:
        s_at, s_rank_cost, s_tokens, s_micro_cost = _started(start, *sorted_plan, at, shift, n_ranks, n_micro)
        _fill(*sorted_plan, s_at, shift, s_rank_cost, s_tokens, s_micro_cost, capacity, s_rank_cost.max())
        if balance_fill(s_rank_cost, s_tokens, capacity) > balance_fill(rank_cost, tokens, capacity):
            at, rank_cost, tokens, micro_cost = s_at, s_rank_cost, s_tokens, s_micro_cost

    _, ratio = score(at, sorted_cost, rank_cost, tokens)
    if ratio > 1.0 + tolerance:
        target = (1.0 + tolerance) * rank_cost.max() / ratio
        moves = 4 * n_ranks + 64
        move_from_costliest(
            sorted_length, sorted_cost, at, shift, rank_cost, tokens, micro_cost, capacity, target, moves
        )
    return by_index(lengths.shape[0], order, at, shift)
