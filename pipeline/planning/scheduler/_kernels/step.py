"""The plan of one step in one numba kernel: plain LPT, made starvation-safe two ways, the better kept.

1. Plain LPT over the candidates (``greedy.lpt_kernel``). It may defer an old sample while it places a newer one at
   least as long, which the scheduler never does.
2. The reference: that plan with the swap repair (``repair.py``), the starvation-safe LPT. The plan
   returned is never worse than it on fill (tokens placed) nor on balance (costliest rank over the lower
   bound of what is placed): ``score``.
3. *Held back*: the LPT plan without the newest candidates holding ``RESERVE`` of the step's tokens (or
   the tokens LPT deferred, where more); then every deferred candidate, oldest first, goes where there is
   room without lifting a rank above LPT's costliest (``greedy.top_up``); the swap repair where an older one
   is still deferred for a newer one. The samples that wait are then the newest ones rather than LPT's
   shortest, and the repair's swaps (which cost fill) are few.
4. The held-back plan where it is at least as good as the reference on both; else the reference with its
   deferred samples, oldest first, put where there is room without lifting its costliest rank, which
   raises fill and the lower bound and leaves the costliest rank as it is. With one capacity, where LPT
   deferred a candidate, the prefix plan (``greedy.prefix_plan``: LPT over the longest prefix in age order that
   it places whole, then the later samples shorter than every deferred one) replaces that where it is
   no worse on both and better on one; only for steps of at most ``PREFIX_CANDIDATES`` candidates.
5. Where the caller gives a ``start`` (a placement of its own, such as step composition's packing of the
   micro-batches' holes), it is completed like the reference (its deferred samples, oldest first, where
   there is room without lifting its costliest rank; then starvation-safe) and kept instead where it
   scores higher on balance times fill (``balance_fill``): a fixed set of samples can pack worse than
   the placement it was chosen for.
6. Samples move from the costliest ranks to the cheapest while the costliest is more than ``tolerance``
   above the lower bound (``rebalance.move_from_costliest``): the costliest rank only falls, what is placed stays.
7. With two capacities, placed samples trade places between ranks (``trades.trade_places``): the costliest rank
   falls where full micro-batches leave no room to move, then the vision encoder's part is evened out
   without lifting the costliest rank, then the LLM's without lifting either; last, ranks exchange whole
   micro-batches (``swaps.swap_micro_batches``) to even out the encoder's part and the LLM's, where samples
   that fill their micro-batches keep single exchanges from it.

Where a micro-batch bounds patches too (``Grid.patch_capacity > 0``) every phase tests both rooms through the
same searches, the candidates go costliest first and the guarantee is on length and patches (``repair.py``).
A swap of the repair may then raise a rank's cost (a sample with fewer tokens and patches can cost more), so
in step 4 the reference with its deferred samples put back is kept only where it is no worse than the
reference on both.

The kernels are cached on disk by ``pipeline.planning.kernels.jit.kernel``, which compiles them again after
an edit of any planning module.
"""

from __future__ import annotations

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.scheduler._kernels.greedy import lpt_kernel, prefix_plan, top_up
from pipeline.planning.scheduler._kernels.rebalance import move_from_costliest
from pipeline.planning.scheduler._kernels.repair import deferred_oldest_first, prefer_older
from pipeline.planning.scheduler._kernels.state import (
    Candidates,
    Grid,
    Placement,
    Samples,
    by_index,
    copy_of,
    flat_slot,
    move_patches,
    move_tokens,
    on_base,
)
from pipeline.planning.scheduler._kernels.trades import trade_places

# The prefix plan runs LPT up to ``greedy.PREFIX_TRIES`` times more: for steps of at most this many
# candidates, where that is a few milliseconds. Over a large step it buys about 0.05% more tokens placed (and
# costs a little balance) for several times the planning time (``benchmarks/scheduler_bench.py``).
PREFIX_CANDIDATES = 50_000
# The held-back plan takes out the newest candidates holding this share of the step's tokens, or as many
# tokens as LPT deferred where that is more.
RESERVE = 0.002


@kernel
def score(cands: Candidates, plan: Placement) -> tuple[np.int64, float]:
    """Tokens placed, and the costliest rank over the lower bound ``max(placed cost / ranks, largest placed
    cost)`` (1.0 when that is 0): ``PlanSummary``'s ``tokens_placed`` and ``balance_ratio``."""
    largest = 0.0
    for k in range(plan.at.shape[0]):  # longest first: the first placed is the costliest
        if plan.at[k] >= 0:
            largest = cands.cost[k]
            break
    rank_cost = plan.rank_cost
    lower = max(rank_cost.sum() / rank_cost.shape[0], largest)
    return plan.tokens.sum(), rank_cost.max() / lower if lower > 0.0 else 1.0


@kernel
def at_least_as_good(plan: tuple[np.int64, float], reference: tuple[np.int64, float]) -> bool:
    """Whether a plan's ``score`` is no worse than the reference's on either."""
    return plan[0] >= reference[0] and plan[1] <= reference[1]


@kernel
def _better(plan: tuple[np.int64, float], reference: tuple[np.int64, float]) -> bool:
    """Whether a plan's ``score`` is no worse than the reference's on either and better on one."""
    return at_least_as_good(plan, reference) and (plan[0] > reference[0] or plan[1] < reference[1])


@kernel
def balance_fill(plan: Placement, capacity: int) -> float:
    """Mean over largest rank cost (1.0 when nothing costs) times the share of the step's tokens placed."""
    largest = plan.rank_cost.max()
    balance = plan.rank_cost.sum() / plan.rank_cost.shape[0] / largest if largest > 0.0 else 1.0
    return balance * plan.tokens.sum() / (np.float64(plan.tokens.shape[0]) * capacity)


@kernel
def _started(start: np.ndarray, cands: Candidates, like: np.ndarray, grid: Grid, base: Placement) -> Placement:
    """The plan ``start`` gives (``rank * micro + m`` per sample, -1 for none) in sorted order, ``at`` of
    ``like``'s type."""
    plan = on_base(np.full_like(like, -1), base)
    for k in range(cands.order.shape[0]):
        slot = start[cands.order[k]]
        if slot >= 0:
            plan.at[k] = ((slot // grid.micro) << grid.shift) | (slot % grid.micro)
            move_tokens(plan, slot // grid.micro, slot, np.int64(cands.length[k]), cands.cost[k])
            move_patches(plan, grid, slot, cands, k, 1)
    return plan


@kernel
def _fill(cands: Candidates, plan: Placement, grid: Grid, cost_cap: float) -> None:
    """Place deferred samples, oldest first, where they fit without lifting a rank above ``cost_cap``, then
    make the plan starvation-safe. In place."""
    top_up(deferred_oldest_first(cands.order, plan.at), cands, plan, grid, cost_cap)
    prefer_older(cands, plan, grid)


@kernel
def _filled(cands: Candidates, plan: Placement, grid: Grid) -> Placement:
    """Step 4's fallback: the reference with its deferred samples put where there is room. With two
    capacities, on a copy that replaces the reference only where it is no worse on fill and balance."""
    if grid.patch_capacity == 0:
        _fill(cands, plan, grid, plan.rank_cost.max())
        return plan
    filled = copy_of(plan)
    _fill(cands, filled, grid, plan.rank_cost.max())
    return filled if at_least_as_good(score(cands, filled), score(cands, plan)) else plan


@kernel
def _hold_back(lengths: np.ndarray, cands: Candidates, plan: Placement, grid: Grid, reserve_tokens: np.int64) -> None:
    """Take the newest candidates holding at most ``reserve_tokens`` out of the plan, in place."""
    newest = cands.order.shape[0]
    held = np.int64(0)
    while newest > 0 and held + lengths[newest - 1] <= reserve_tokens:
        newest -= 1
        held += lengths[newest]
    for k in range(plan.at.shape[0]):
        if cands.order[k] >= newest and plan.at[k] >= 0:
            at = plan.at[k]
            move_tokens(plan, at >> grid.shift, flat_slot(grid, at), -np.int64(cands.length[k]), -cands.cost[k])
            move_patches(plan, grid, flat_slot(grid, at), cands, k, -1)
            plan.at[k] = -1


@kernel
def _held_back(lengths: np.ndarray, cands: Candidates, lpt: Placement, grid: Grid) -> Placement:
    """Step 3: LPT's plan without its newest candidates, then filled (a copy)."""
    plan = copy_of(lpt)
    lpt_deferred = np.int64(0)
    for k in range(plan.at.shape[0]):
        if plan.at[k] < 0:
            lpt_deferred += cands.length[k]
    reserve_tokens = max(np.int64(RESERVE * np.float64(grid.ranks) * grid.micro * grid.capacity), lpt_deferred)
    _hold_back(lengths, cands, plan, grid, reserve_tokens)
    _fill(cands, plan, grid, lpt.rank_cost.max())
    return plan


@kernel
def plan_kernel(
    samples: Samples, grid: Grid, tolerance: float, at: np.ndarray, start: np.ndarray, base: Placement
) -> tuple[np.ndarray, np.ndarray]:
    """Rank and micro-batch of every sample (int32, -1 when deferred). ``samples`` are checked already (their
    costs ``CostModel.costs`` or the caller's); ``at`` is scratch for ``lpt_kernel``; ``start`` a checked
    placement to start from (step 5), or empty."""
    cands, plan = lpt_kernel(samples, grid, at, base)
    lpt_whole = (plan.at >= 0).all()
    held = _held_back(samples.lengths, cands, plan, grid)  # from LPT's plan, before the repair below changes it
    prefer_older(cands, plan, grid)
    plan = held if at_least_as_good(score(cands, held), score(cands, plan)) else _filled(cands, plan, grid)
    if grid.patch_capacity == 0 and not lpt_whole and plan.at.shape[0] <= PREFIX_CANDIDATES:
        prefixed = prefix_plan(cands, grid, plan.at, base)
        if _better(score(cands, prefixed), score(cands, plan)):
            plan = prefixed
    if start.shape[0] > 0:
        started = _started(start, cands, plan.at, grid, base)
        _fill(cands, started, grid, started.rank_cost.max())
        if balance_fill(started, grid.capacity) > balance_fill(plan, grid.capacity):
            plan = started
    _, ratio = score(cands, plan)
    if ratio > 1.0 + tolerance:
        target = (1.0 + tolerance) * plan.rank_cost.max() / ratio
        move_from_costliest(cands, plan, grid, target, 4 * grid.ranks + 64)
    if grid.patch_capacity > 0:
        trade_places(cands, plan, grid, tolerance)
    return by_index(samples.lengths.shape[0], cands.order, plan.at, grid.shift)
