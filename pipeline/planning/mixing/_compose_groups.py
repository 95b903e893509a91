"""The numba kernel that builds one group of long samples per rank up to a level of excess cost.

Seeds go first, the largest first, each onto the rank with the least excess that has room in a
micro-batch (else onto the least loaded rank). Then the rank with the least excess, while more than
``slack`` below the level, takes the candidate with the largest excess that keeps it at most ``slack``
above the level and fits one of its micro-batches; a rank that finds none is closed. A sample goes into
the fullest micro-batch with room for it, which keeps whole micro-batches free for the next long ones.
Every tie is broken by index, so the result is the same on any machine. The rank with the least excess
is found in trees over the ranks (with room for a seed: the scheduler's top-up search; among the open ranks:
a tournament tree), not by a scan of every rank, which at 10,240 ranks made a call cost O(R^2).

**Packing the holes.** Short samples fill the ranks around the groups. Where a source's short samples
cannot fill its allowance (a window of mostly long samples: uniform lengths up to the context, or long
documents that hold most of the tokens), the holes the groups leave stay empty unless something fits
them, so the kernel can pack them itself (``_fill_holes``): long and short candidates, the longest that
fits the emptiest micro-batch of the rank of least excess, but no longer than keeps that rank near a
target excess (the mean over ranks of a first, greedy packing), so the ranks end full *and* alike.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pipeline.planning.scheduler._heaps import new_min_tree, set_key
from pipeline.planning.scheduler._topup import update_rank


@njit(cache=True)
def _room(bins: np.ndarray, r: int, length: int, capacity: int) -> int:
    """The fullest micro-batch of rank ``r`` with room for ``length`` tokens; -1 if none."""
    best, best_fill = -1, -1
    for m in range(bins.shape[1]):
        held = bins[r, m]
        if held + length <= capacity and held > best_fill:
            best, best_fill = m, held
    return best


@njit(cache=True)
def rank_trees(excess: np.ndarray, room: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Least excess (ties: lowest rank) and most room in a micro-batch over subtrees of ranks, as
    ``_least_with_room`` searches them: (min_excess, max_room, leaves)."""
    leaves = 1
    while leaves < len(excess):
        leaves *= 2
    min_excess = np.full(2 * leaves, np.inf)
    max_room = np.full(2 * leaves, -1, np.int64)
    for r in range(len(excess)):
        update_rank(min_excess, max_room, leaves, r, excess[r], room[r])
    return min_excess, max_room, leaves


@njit(cache=True)
def _least_with_room(min_excess: np.ndarray, max_room: np.ndarray, leaves: int, length: np.int64) -> int:
    """The rank of least excess with a micro-batch of room ``>= length`` (ties: the lowest), or -1: a
    depth-first search that enters the child of less excess first (the left one on a tie) and prunes
    subtrees without room or without a rank that beats the best so far, by excess and then by rank."""
    best, best_excess = -1, np.inf
    stack = np.empty(128, np.int64)
    stack[0] = 1
    depth = 1
    while depth > 0:
        depth -= 1
        node = stack[depth]
        if max_room[node] < length or min_excess[node] > best_excess:
            continue
        if min_excess[node] == best_excess and _lowest_rank(node, leaves) > best:
            continue
        if node >= leaves:
            best, best_excess = node - leaves, min_excess[node]
            continue
        left, right = 2 * node, 2 * node + 1
        if min_excess[right] < min_excess[left]:
            left, right = right, left
        stack[depth] = right  # popped after the whole of the other child
        stack[depth + 1] = left
        depth += 2
    return best


@njit(cache=True)
def _lowest_rank(node: int, leaves: int) -> int:
    while node < leaves:
        node *= 2
    return node - leaves


@njit(cache=True)
def _next_free(skip: np.ndarray, j: int) -> int:
    """The first position >= ``j`` of the ranked candidates not chosen yet (``skip`` is path-compressed)."""
    root = j
    while skip[root] != root:
        root = skip[root]
    while skip[j] != root:
        nxt = skip[j]
        skip[j] = root
        j = nxt
    return root


@njit(cache=True)
def build_groups_kernel(
    seed_excess: np.ndarray,
    seed_length: np.ndarray,
    cand_excess: np.ndarray,
    cand_length: np.ndarray,
    cand_source: np.ndarray,
    held: np.ndarray,
    order: np.ndarray,
    allowance: np.ndarray,
    level: float,
    slack: float,
    ranks: int,
    micro_batches: int,
    capacity: int,
    by_length: np.ndarray,
    filler: np.ndarray,
    first: np.ndarray,
    goal: float,
    shape_excess: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(chosen candidates as a bool mask, excess per rank, tokens per rank and micro-batch, and the
    micro-batch ``rank * micro_batches + m`` each seed, candidate and ``first`` sample went into, -1 for
    none). ``order``
    ranks the candidates to group by decreasing excess; ``held`` marks candidates already among the seeds
    (chosen, never picked again); a candidate counts against its source's ``allowance`` (tokens), which
    only the last one picked from a source may overshoot. The other arguments are ``_pack``'s."""
    excess = np.zeros(ranks)
    bins = np.zeros((ranks, micro_batches), dtype=np.int64)
    seed_slot = np.full(len(seed_length), -1, np.int64)
    cand_slot = np.full(len(cand_length), -1, np.int64)
    first_slot = np.full(len(first), -1, np.int64)
    min_excess, max_room, leaves = rank_trees(excess, np.full(ranks, capacity, np.int64))
    for i in np.argsort(-seed_excess, kind="mergesort"):
        length = seed_length[i]
        target = _least_with_room(min_excess, max_room, leaves, np.int64(length))
        if target < 0:
            target = int(np.argmin(excess))
        else:
            m = _room(bins, target, length, capacity)
            bins[target, m] += length
            seed_slot[i] = target * micro_batches + m
        excess[target] += seed_excess[i]
        update_rank(min_excess, max_room, leaves, target, excess[target], capacity - bins[target].min())

    n = len(order)
    chosen = held.copy()
    left = allowance.astype(np.float64)
    ranked = np.empty(n)
    skip = np.arange(n + 1)
    for j in range(n):
        ranked[j] = -cand_excess[order[j]]  # increasing
        if held[order[j]]:
            skip[j] = j + 1
    # The open ranks by excess (ties: lowest rank); a closed rank's key is +inf.
    by_excess, by_excess_id, inner = new_min_tree(ranks)
    for k in range(ranks):
        set_key(by_excess, by_excess_id, inner, k, excess[k])
    while by_excess[0] < np.inf:
        r = by_excess_id[0]
        if level - excess[r] <= slack:
            set_key(by_excess, by_excess_id, inner, r, np.inf)
            continue
        j = _next_free(skip, int(np.searchsorted(ranked, excess[r] - level - slack)))
        pick, pick_m = -1, -1
        while j < n:
            c = order[j]
            if left[cand_source[c]] > 0:
                m = _room(bins, r, cand_length[c], capacity)
                if m >= 0:
                    pick, pick_m = j, m
                    break
            else:  # an allowance only shrinks: no rank takes this candidate any more
                skip[j] = j + 1
            j = _next_free(skip, j + 1)
        if pick < 0:
            set_key(by_excess, by_excess_id, inner, r, np.inf)
            continue
        c = order[pick]
        skip[pick] = pick + 1
        chosen[c] = True
        bins[r, pick_m] += cand_length[c]
        cand_slot[c] = r * micro_batches + pick_m
        excess[r] += cand_excess[c]
        left[cand_source[c]] -= cand_length[c]
        set_key(by_excess, by_excess_id, inner, r, excess[r])
    short_of_filler = False
    for s in range(len(left)):
        short_of_filler |= left[s] > filler[s]
    if short_of_filler:
        pack = (cand_excess, cand_length, cand_source, by_length, first, goal, capacity, shape_excess)
        _pack(excess, bins, chosen, left, cand_slot, first_slot, pack)
    return chosen, excess, bins, seed_slot, cand_slot, first_slot


@njit(cache=True)
def _pack(
    excess: np.ndarray,
    bins: np.ndarray,
    chosen: np.ndarray,
    left: np.ndarray,
    cand_slot: np.ndarray,
    first_slot: np.ndarray,
    pack: tuple,
) -> None:
    """``_fill_holes`` towards the mean excess per rank of a first, greedy ``_fill_holes``."""
    trial = (excess.copy(), bins.copy(), chosen.copy(), left.copy(), cand_slot.copy(), first_slot.copy())
    _fill_holes(*trial, np.inf, *pack)
    _fill_holes(excess, bins, chosen, left, cand_slot, first_slot, trial[0].mean(), *pack)


@njit(cache=True)
def drop_position(up: np.ndarray, down: np.ndarray, j: int) -> None:
    """Take position ``j`` out of both path-compressed lists (``down`` is shifted by one: 0 is "none")."""
    up[j] = j + 1
    down[j + 1] = j


@njit(cache=True)
def longest_free(
    limit: float,
    sorted_length: np.ndarray,
    up: np.ndarray,
    down: np.ndarray,
    left: np.ndarray,
    cand_source: np.ndarray,
    by_length: np.ndarray,
) -> int:
    """One past the position (in ``by_length`` order) of the longest candidate of at most ``limit`` tokens
    that is not taken and whose source has allowance ``left``, or 0 for none; candidates of sources without
    allowance are dropped on the way (an allowance only shrinks)."""
    p = _next_free(down, int(np.searchsorted(sorted_length, limit, side="right")))
    while p > 0 and left[cand_source[by_length[p - 1]]] <= 0:
        drop_position(up, down, p - 1)
        p = _next_free(down, p - 1)
    return p


@njit(cache=True)
def _fill_holes(
    excess: np.ndarray,
    bins: np.ndarray,
    chosen: np.ndarray,
    left: np.ndarray,
    cand_slot: np.ndarray,
    first_slot: np.ndarray,
    target: float,
    cand_excess: np.ndarray,
    cand_length: np.ndarray,
    cand_source: np.ndarray,
    by_length: np.ndarray,
    first: np.ndarray,
    goal: float,
    capacity: int,
    shape_excess: np.ndarray,
) -> None:
    """Pack the micro-batches' holes where short samples are too few to fill them. The samples every option
    holds (``first``: deferred and due short samples, sources without a window) go into the fullest
    micro-batch with room of the rank of least excess. Then, while the step holds less than ``goal``
    tokens, the rank of least excess with room for the shortest candidate left takes a candidate (long or
    short; ``by_length`` lists them by increasing length) from a source with allowance left, into its
    emptiest micro-batch: the longest that fits, or with a finite ``target`` excess per rank, the longest
    that leaves the rest of the hole fillable by one more sample without passing the rank's share of the
    target for that hole (``shape_excess``: a sample of ``L`` tokens has excess ``a*L*L + b*L + g``);
    the shortest that fits where none is that short.

    The hole of ``h`` tokens with excess gap ``G`` is filled by one sample where ``e(h) <= G``; else the
    first of two samples ``h/2 + x`` and ``h/2 - x`` with ``e(h/2 + x) + e(h/2 - x) <= G``, that is
    ``a*(h*h/2 + 2*x*x) + b*h + 2*g <= G``."""
    n = len(by_length)
    ranks = bins.shape[0]
    room = np.empty(ranks, np.int64)
    for r in range(ranks):
        room[r] = capacity - bins[r].min()
    min_excess, max_room, leaves = rank_trees(excess, room)
    total = float(bins.sum())
    for i in np.argsort(-first, kind="mergesort"):
        r = _least_with_room(min_excess, max_room, leaves, np.int64(first[i]))
        if r >= 0:
            m = _room(bins, r, first[i], capacity)
            bins[r, m] += first[i]
            first_slot[i] = r * bins.shape[1] + m
            update_rank(min_excess, max_room, leaves, r, excess[r], capacity - bins[r].min())
        total += first[i]
    sorted_length = np.empty(n, np.int64)
    up = np.arange(n + 1)  # _next_free over by_length
    down = np.arange(n + 1)  # _next_free downwards; position p + 1 stands for p
    for j in range(n):
        sorted_length[j] = cand_length[by_length[j]]
        if chosen[by_length[j]]:
            drop_position(up, down, j)
    while total < goal:
        j = _next_free(up, 0)
        while j < n and left[cand_source[by_length[j]]] <= 0:
            drop_position(up, down, j)
            j = _next_free(up, j + 1)
        if j >= n:
            return
        r = _least_with_room(min_excess, max_room, leaves, np.int64(sorted_length[j]))
        if r < 0:
            return
        m = int(np.argmin(bins[r]))
        hole = capacity - bins[r, m]
        longest = hole
        if target < np.inf:
            holes = capacity * bins.shape[1] - bins[r].sum()
            gap = (target - excess[r]) * hole / holes
            a, b, g = shape_excess[0], shape_excess[1], shape_excess[2]
            if a * hole * hole + b * hole + g > gap:  # one sample over the hole passes the target
                spare = gap - (a * hole * hole / 2 + b * hole + 2 * g)
                longest = hole / 2 + (np.sqrt(spare / (2 * a)) if spare > 0 and a > 0 else 0.0)
        p = longest_free(longest, sorted_length, up, down, left, cand_source, by_length)
        if p == 0:  # nothing as short as the target wants: the shortest that fits
            p = j + 1
        c = by_length[p - 1]
        drop_position(up, down, p - 1)
        chosen[c] = True
        bins[r, m] += cand_length[c]
        cand_slot[c] = r * bins.shape[1] + m
        excess[r] += cand_excess[c]
        left[cand_source[c]] -= cand_length[c]
        total += cand_length[c]
        update_rank(min_excess, max_room, leaves, r, excess[r], capacity - bins[r].min())
