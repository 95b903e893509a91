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
def _pair_samples(members: Members, a: int, b: int) -> np.ndarray:
    held_a = members.member[members.begin[a] : members.begin[a + 1]]
    held_b = members.member[members.begin[b] : members.begin[b + 1]]
    return np.concatenate((held_a, held_b))


@kernel
def _best_fit(cands: Candidates, grid: Grid, tokens: np.ndarray, patches: np.ndarray, side: int, k: np.int64) -> int:
    """The micro-batch (0..micro-1) of pair side ``side`` with room for ``k`` that it leaves least room in, in the
    kind it fills more of; -1 where none has room."""
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
def _pack(
    cands: Candidates, grid: Grid, ratios: np.ndarray, members: np.ndarray, kind: int
) -> tuple[bool, np.ndarray, float]:
    """``members`` packed over the two sides in order ``kind``: each one's side and micro-batch (``side * micro +
    m``), and the pair's largest ratio; False where a sample fits neither side."""
    keys = np.empty(members.shape[0])
    for t in range(members.shape[0]):
        k = members[t]
        if kind < 3:
            keys[t] = -ratios[k, kind]
        else:
            keys[t] = -max(ratios[k, 0], ratios[k, 1], ratios[k, 2])
    order = np.argsort(keys, kind="mergesort")
    tokens = np.zeros(2 * grid.micro, np.int64)
    patches = np.zeros(2 * grid.micro, np.int64)
    load = np.zeros((2, 3))
    slot_of = np.empty(members.shape[0], np.int64)
    for t in order:
        k = members[t]
        best_side, best_m, best_score = -1, -1, np.inf
        for side in range(2):
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
    largest = 0.0
    for side in range(2):
        for p in range(3):
            largest = max(largest, load[side, p])
    return True, slot_of, largest


@kernel
def repack_pair(
    cands: Candidates,
    plan: Placement,
    grid: Grid,
    held: tuple[Members, np.ndarray],
    ranks: tuple[int, int],
    now: float,
) -> bool:
    """Ranks ``a`` and ``b`` (``ranks``) packed again where some order gives a largest ratio below ``now`` (the
    pair's as it is); whether they were. In place."""
    a, b = ranks
    ratios = held[1]
    members = _pair_samples(held[0], a, b)
    best, best_slots = now * (1.0 - 1e-9), np.empty(0, np.int64)
    for kind in range(ORDERS):
        packed, slots, largest = _pack(cands, grid, ratios, members, kind)
        if packed and largest < best:
            best, best_slots = largest, slots
    if best_slots.shape[0] != members.shape[0]:
        return False
    for r in (a, b):
        plan.rank_cost[r] = 0.0
        for slot in range(r * grid.micro, (r + 1) * grid.micro):
            plan.tokens[slot], plan.micro_cost[slot], plan.patches[slot] = 0, 0.0, 0
    for t in range(members.shape[0]):
        k = members[t]
        r = a if best_slots[t] < grid.micro else b
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
def repack_worst(cands: Candidates, plan: Placement, grid: Grid, ratios: np.ndarray, target: float, limit: int) -> int:
    """While the largest ratio is above ``target`` and some pair of its rank and another packs better, pack it
    (the partners of least load in that rank's worst load first); at most ``limit`` times. Returns how many. In
    place."""
    done = 0
    while done < limit:
        held = (members_of(plan, grid), ratios)
        per_rank = rank_ratios(plan, grid, ratios)
        worst, a, p = -1.0, 0, 0
        for r in range(grid.ranks):
            for q in range(3):
                if per_rank[r, q] > worst:
                    worst, a, p = per_rank[r, q], r, q
        if worst <= target:
            return done
        moved = False
        for b in np.argsort(per_rank[:, p], kind="mergesort")[: PARTNERS + 1]:
            if b == a:
                continue
            now = max(per_rank[a].max(), per_rank[b].max())
            if repack_pair(cands, plan, grid, held, (a, int(b)), now):
                moved = True
                break
        if not moved:
            return done
        done += 1
    return done
