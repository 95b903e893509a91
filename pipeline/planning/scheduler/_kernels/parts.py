"""Every load of a multimodal step near its own bound at once: the total, the vision encoder's part and the LLM's.

The trade passes (``trades.py``) even out the total first and each part only under caps that never lift the
total's maximum (nor the other part's). Where text samples that fill a micro-batch sit beside big images, that
leaves a part well above what the step's samples allow: the placements that hold every load near its bound put the
images of many patches and few tokens beside a long text and let the total rise a little on a rank without one,
which no exchange under those caps reaches.

Here the objective is the one every load shares: ``z``, the largest over the three loads of the rank of most load
over that load's bound (the least any placement of the step's samples can reach, given by the caller: the strong
bounds cost more than a plan). A round first packs pairs of ranks again (``repack.py``: the rank of ``z`` with
another, both packed from scratch, kept where the pair's largest ratio falls), the one-for-many exchange a
micro-batch full of patches needs; then tries each load above its bound in turn: the trade pass and the micro-batch
swaps even it out with the two others capped a share of the way from their own largest ratio up to ``z``
(``CAP_STEPS``); the trial of least ``z`` (then least sum of the parts' largest ranks, a step's time where each part
waits for its slowest rank) is kept where it lowers either. Rounds go on while either move helps and ``z`` is above
``1 + tolerance``. Only exchanges of what is placed: fill and the guarantee against starvation stay as they are;
``z`` never rises, so no load ends above the largest ratio it started at.
"""

from __future__ import annotations

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.scheduler._kernels.repack import repack_worst, sample_ratios
from pipeline.planning.scheduler._kernels.state import Candidates, Grid, Pass, Placement, copy_of
from pipeline.planning.scheduler._kernels.swaps import swap_micro_batches
from pipeline.planning.scheduler._kernels.trades import Members, even_out, members_of

# How far towards ``z`` a pass may lift the loads it does not even out: shares of the way from their largest ratio.
CAP_STEPS = (1.0, 0.5, 0.25)
# Rounds at most; the search ends sooner where a round moves nothing.
ROUNDS = 12
# Partner ranks a trade pass tries for one rank.
_TRIES = 32


@kernel
def _loads(cands: Candidates, plan: Placement, grid: Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    total, encoder = np.zeros(grid.ranks), np.zeros(grid.ranks)
    for k in range(plan.at.shape[0]):
        if plan.at[k] >= 0:
            r = plan.at[k] >> grid.shift
            total[r] += cands.cost[k]
            encoder[r] += cands.encoder[k]
    return total, encoder, total - encoder


@kernel
def _figures(loads: tuple[np.ndarray, np.ndarray, np.ndarray], bounds: np.ndarray) -> tuple[float, float]:
    """``z`` and the sum of the parts' largest ranks."""
    z = 0.0
    for p in range(3):
        if bounds[p] > 0.0:
            z = max(z, loads[p].max() / bounds[p])
    return z, loads[1].max() + loads[2].max()


@kernel
def _better(trial: tuple[float, float], best: tuple[float, float]) -> bool:
    if trial[0] < best[0] * (1.0 - 1e-9):
        return True
    return trial[0] <= best[0] and trial[1] < best[1] * (1.0 - 1e-9)


@kernel
def _trial(
    cands: Candidates,
    plan: Placement,
    grid: Grid,
    members: Members,
    bounds: np.ndarray,
    p: int,
    share: float,
    tolerance: float,
) -> tuple[Placement, Members, tuple[float, float]]:
    """Load ``p`` (0 total, 1 encoder, 2 LLM) evened out on a copy, the two others capped ``share`` of the way
    from their largest ratio up to the plan's ``z``."""
    trial = copy_of(plan)
    held = Members(members.begin, members.member.copy(), members.where.copy())
    loads = _loads(cands, trial, grid)
    z, _ = _figures(loads, bounds)
    values = (cands.cost, cands.encoder, cands.cost - cands.encoder)
    q, s = (p + 1) % 3, (p + 2) % 3
    caps = np.empty(3)
    for o in (q, s):
        ratio = loads[o].max() / bounds[o] if bounds[o] > 0.0 else 0.0
        caps[o] = bounds[o] * (ratio + share * (z - ratio)) if bounds[o] > 0.0 else np.inf
    one = Pass(loads[p], values[p], loads[q], values[q], caps[q], loads[s], values[s], caps[s])
    target = (1.0 + tolerance) * bounds[p]
    limits = (4 * grid.ranks + 64, _TRIES)
    even_out(cands, trial, grid, held, one, target, limits)
    swap_micro_batches(cands, trial, grid, one, target, limits)
    return trial, held, _figures(loads, bounds)


@kernel
def even_parts(cands: Candidates, plan: Placement, grid: Grid, bounds: np.ndarray, tolerance: float) -> None:
    """The search of the module docstring over ``plan`` (every candidate placed or not, as it stays); ``bounds``:
    the total's, the encoder part's and the LLM part's (a load with bound 0 is neither evened out nor capped).
    In place."""
    members = members_of(plan, grid)
    best = _figures(_loads(cands, plan, grid), bounds)
    ratios = sample_ratios(cands, bounds)
    for _ in range(ROUNDS):
        repacked = repack_worst(cands, plan, grid, ratios, 1.0 + tolerance, 4 * grid.ranks + 64) > 0
        if repacked:
            members = members_of(plan, grid)
            best = _figures(_loads(cands, plan, grid), bounds)
        if best[0] <= 1.0 + tolerance:
            return
        loads = _loads(cands, plan, grid)
        kept = False
        best_plan, best_members = plan, members
        for p in range(3):
            if bounds[p] <= 0.0 or loads[p].max() <= (1.0 + tolerance) * bounds[p]:
                continue
            for share in CAP_STEPS:
                trial, held, figures = _trial(cands, plan, grid, members, bounds, p, share, tolerance)
                if _better(figures, best):
                    best, best_plan, best_members, kept = figures, trial, held, True
        if not kept:
            if not repacked:
                return
            continue
        plan.at[:] = best_plan.at
        plan.rank_cost[:] = best_plan.rank_cost
        plan.tokens[:] = best_plan.tokens
        plan.micro_cost[:] = best_plan.micro_cost
        plan.patches[:] = best_plan.patches
        members = best_members
