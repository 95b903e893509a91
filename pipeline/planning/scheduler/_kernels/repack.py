"""Two ranks' samples packed again from scratch: the move that exchanges of single samples and whole micro-batches
cannot make.

Where a micro-batch is full in patches (the images beside a micro-batch-long text), a rank can shed its LLM part
only by taking one big image for several small ones: a one-for-many exchange. Packing the two ranks' samples
again reaches it: each sample, in one of a few orders, goes to the rank of the two where the largest of its three
loads over their bounds (total, encoder part, LLM part) ends lowest, into the micro-batch of that rank with room
whose room of the scarcer kind it fills the most (best fit). A packing is kept where it places every sample and
the pair's largest ratio falls; the loads of no other rank move.
"""

from __future__ import annotations

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.scheduler._kernels.state import Candidates, Grid, Placement
from pipeline.planning.scheduler._kernels.trades import Members, members_of

# The orders a pair is packed in: by total cost, the encoder's part, the LLM's, and the largest ratio to bound.
ORDERS = 4
# Partners tried for the rank of the largest ratio: those of least load in its worst load first.
PARTNERS = 32


@kernel
def sample_ratios(cands: Candidates, bounds: np.ndarray) -> np.ndarray:
    """Each candidate's three loads over their bounds (0 where a bound is 0), shape (n, 3)."""
    n = cands.cost.shape[0]
    out = np.zeros((n, 3))
    for k in range(n):
        values = (cands.cost[k], cands.encoder[k], cands.cost[k] - cands.encoder[k])
        for p in range(3):
            if bounds[p] > 0.0:
                out[k, p] = values[p] / bounds[p]
    return out


@kernel
def _group_samples(members: Members, group: np.ndarray) -> np.ndarray:
    count = 0
    for r in group:
        count += members.begin[r + 1] - members.begin[r]
    out = np.empty(count, np.int64)
    at = 0
    for r in group:
        for y in range(members.begin[r], members.begin[r + 1]):
            out[at] = members.member[y]
            at += 1
    return out


@kernel
def _best_fit(cands: Candidates, grid: Grid, tokens: np.ndarray, patches: np.ndarray, side: int, k: np.int64) -> int:
    """The micro-batch (0..micro-1) of the group's rank ``side`` with room for ``k`` that it leaves least room in, in
    the kind it fills more of; -1 where none has room."""
    best, best_left = -1, np.inf
    length, held = np.int64(cands.length[k]), cands.patches[k]
    for m in range(grid.micro):
        slot = side * grid.micro + m
        if tokens[slot] + length > grid.capacity or patches[slot] + held > grid.patch_capacity:
            continue
        left_tokens = (grid.capacity - tokens[slot] - length) / grid.capacity
        left_patches = (grid.patch_capacity - patches[slot] - held) / grid.patch_capacity
        left = min(left_tokens, left_patches)
        if left < best_left:
            best, best_left = m, left
    return best


@kernel
def _key(ratios: np.ndarray, k: np.int64, kind: int) -> float:
    """Sample ``k``'s place in order ``kind`` (``ORDERS``), least first: the most of one load's ratio (0 total, 1
    encoder, 2 LLM) or of the largest of the three first."""
    if kind < 3:
        return -ratios[k, kind]
    return -max(ratios[k, 0], ratios[k, 1], ratios[k, 2])


@kernel
def _pack(
    cands: Candidates, grid: Grid, ratios: np.ndarray, members: np.ndarray, sides: int, kind: int
) -> tuple[bool, np.ndarray, float]:
    """``members`` packed over ``sides`` ranks in order ``kind``: each one's side and micro-batch (``side * micro +
    m``), and the group's largest ratio; False where a sample fits no side."""
    keys = np.empty(members.shape[0])
    for t in range(members.shape[0]):
        keys[t] = _key(ratios, members[t], kind)
    order = np.argsort(keys, kind="mergesort")
    tokens = np.zeros(sides * grid.micro, np.int64)
    patches = np.zeros(sides * grid.micro, np.int64)
    load = np.zeros((sides, 3))
    slot_of = np.empty(members.shape[0], np.int64)
    for t in order:
        k = members[t]
        best_side, best_m, best_score = -1, -1, np.inf
        for side in range(sides):
            m = _best_fit(cands, grid, tokens, patches, side, k)
            if m < 0:
                continue
            score = 0.0
            for p in range(3):
                score = max(score, load[side, p] + ratios[k, p])
            if score < best_score:
                best_side, best_m, best_score = side, m, score
        if best_side < 0:
            return False, slot_of, np.inf
        slot = best_side * grid.micro + best_m
        tokens[slot] += np.int64(cands.length[k])
        patches[slot] += cands.patches[k]
        for p in range(3):
            load[best_side, p] += ratios[k, p]
        slot_of[t] = slot
    return True, slot_of, load.max()


@kernel
def repack_group(
    cands: Candidates, plan: Placement, grid: Grid, held: tuple[Members, np.ndarray], group: np.ndarray, now: float
) -> bool:
    """The ranks of ``group`` packed again where some order gives a largest ratio below ``now`` (the group's as it
    is); whether they were. In place."""
    ratios = held[1]
    members = _group_samples(held[0], group)
    best, best_slots = now * (1.0 - 1e-9), np.empty(0, np.int64)
    for kind in range(ORDERS):
        packed, slots, largest = _pack(cands, grid, ratios, members, group.shape[0], kind)
        if packed and largest < best:
            best, best_slots = largest, slots
    if best_slots.shape[0] != members.shape[0]:
        return False
    for r in group:
        plan.rank_cost[r] = 0.0
        for slot in range(r * grid.micro, (r + 1) * grid.micro):
            plan.tokens[slot], plan.micro_cost[slot], plan.patches[slot] = 0, 0.0, 0
    for t in range(members.shape[0]):
        k = members[t]
        r = group[best_slots[t] // grid.micro]
        m = best_slots[t] % grid.micro
        slot = r * grid.micro + m
        plan.at[k] = (np.int64(r) << grid.shift) | m
        plan.tokens[slot] += np.int64(cands.length[k])
        plan.patches[slot] += cands.patches[k]
        plan.micro_cost[slot] += cands.cost[k]
        plan.rank_cost[r] += cands.cost[k]
    return True


@kernel
def rank_ratios(plan: Placement, grid: Grid, ratios: np.ndarray) -> np.ndarray:
    """Each rank's three loads over their bounds, shape (ranks, 3)."""
    out = np.zeros((grid.ranks, 3))
    for k in range(plan.at.shape[0]):
        if plan.at[k] >= 0:
            r = plan.at[k] >> grid.shift
            for p in range(3):
                out[r, p] += ratios[k, p]
    return out


@kernel
def _repack_one(cands: Candidates, plan: Placement, grid: Grid, ratios: np.ndarray, target: float) -> int:
    """The rank of the largest ratio and a partner packed again (the module docstring): 1 where they were, 0 where
    no partner helps, -1 where the largest ratio is within ``target``."""
    held = (members_of(plan, grid), ratios)
    per_rank = rank_ratios(plan, grid, ratios)
    worst, a, p = -1.0, 0, 0
    for r in range(grid.ranks):
        for q in range(3):
            if per_rank[r, q] > worst:
                worst, a, p = per_rank[r, q], r, q
    if worst <= target:
        return -1
    partners = np.argsort(per_rank[:, p], kind="mergesort")
    partners = partners[partners != a]
    pair = np.empty(2, np.int64)
    pair[0] = a
    for b in partners[:PARTNERS]:
        pair[1] = b
        if repack_group(cands, plan, grid, held, pair, max(per_rank[a].max(), per_rank[b].max())):
            return 1
    return 0


@kernel
def repack_worst(cands: Candidates, plan: Placement, grid: Grid, ratios: np.ndarray, target: float, limit: int) -> int:
    """While the largest ratio is above ``target`` and its rank and some partner pack better, pack them (the partners
    of least load in that rank's worst load first); at most ``limit`` times. Returns how many. In place."""
    done = 0
    while done < limit and _repack_one(cands, plan, grid, ratios, target) > 0:
        done += 1
    return done
