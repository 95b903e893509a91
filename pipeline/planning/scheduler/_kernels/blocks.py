"""Context-parallel samples onto blocks of ranks: the kernel ``plan_cp_step`` runs before the step's other
samples are planned around what it placed.

A *block micro-batch* is micro-batch ``m`` of the ``c`` consecutive ranks ``first .. first + c - 1``: the block's
ranks work on its samples together, each sample split ``c`` ways, so it holds only samples of that ``c`` and
every one of its ranks holds the same slice tokens there. A slot (rank, micro-batch) is free, or belongs to
one block micro-batch (``slot_first``, ``slot_cp``). Candidates go costliest first; each takes the block
micro-batch, new or joined, whose costliest rank is cheapest after it (ties: the smaller block, the lowest
first rank, then micro-batch), among the sizes it may have (its least, and, where on those it would end past
the step's expected end, the larger ones given: a wider block costs more GPU time but may end sooner) and the
blocks the mode allows (aligned: ``first`` a multiple of
``c``; free: any), unless a new block micro-batch would leave the free slots less room than ``reserve`` of that
candidate (the tokens of the older samples not split, which are planned after). Last, oldest first, a
deferred sample takes the place of a newer placed one at least as long on a block at least its least size
(the shortest, the newest among equals): no sample waits for a newer one whose place it could take.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pipeline.planning.kernels.jit import kernel


class Blocks(NamedTuple):
    """The step's slots as the context-parallel samples leave them, and where each sample went."""

    rank_cost: np.ndarray  # float64 by rank
    tokens: np.ndarray  # int64 by slot (rank * micro + m): slice tokens on the rank
    slot_first: np.ndarray  # int64 by slot: the block's first rank, or -1 while free
    slot_cp: np.ndarray  # int64 by slot: the block's size (0 while free)
    first: np.ndarray  # int64 by sample: its block's first rank, or -1 while deferred
    micro: np.ndarray  # int64 by sample
    cp: np.ndarray  # int64 by sample: its block's size (0 while deferred)


@kernel
def place_blocks(
    lengths: np.ndarray,
    sizes: np.ndarray,
    slices: np.ndarray,
    cost_within: np.ndarray,
    cost_across: np.ndarray,
    reserve: np.ndarray,
    order: np.ndarray,
    shape: tuple[int, int, int, int, bool],
    target: float,
) -> Blocks:
    """Place the samples in ``order`` (positions, costliest first). Sample ``i`` may have the block sizes
    ``sizes[i, k]`` (0: no more), smallest first, on which each of its ranks holds ``slices[i, k]`` tokens and
    spends ``cost_within[i, k]`` on a block within a node, ``cost_across[i, k]`` on one that spans nodes;
    ``shape``: ranks, micro-batches, tokens a slot holds, ranks a node, aligned blocks. A larger size is tried
    only where the sample would end past ``target`` (the step's expected end) on the sizes tried before."""
    ranks, micro, capacity, per_node, aligned = shape
    n = lengths.shape[0]
    blocks = Blocks(
        np.zeros(ranks),
        np.zeros(ranks * micro, np.int64),
        np.full(ranks * micro, -1, np.int64),
        np.zeros(ranks * micro, np.int64),
        np.full(n, -1, np.int64),
        np.full(n, -1, np.int64),
        np.zeros(n, np.int64),
    )
    free_tokens = np.int64(ranks) * micro * capacity
    busiest = np.zeros(ranks)  # by first rank: the costliest rank of the block of c ranks from it
    for i in order:
        best, best_first, best_micro, best_new, best_k = np.inf, -1, -1, False, -1
        for k in range(sizes.shape[1]):
            c = sizes[i, k]
            if c == 0 or (best_first >= 0 and best <= target):
                break
            step = c if aligned else 1
            _window_max(blocks.rank_cost, c, aligned, busiest)
            for first in range(0, ranks - c + 1, step):
                across = first // per_node != (first + c - 1) // per_node
                cost = cost_across[i, k] if across else cost_within[i, k]
                score = busiest[first] + cost
                if score >= best:
                    continue
                may_open = free_tokens - c * capacity >= reserve[i]
                m, new = _room(blocks, first, c, slices[i, k], micro, capacity, may_open)
                if m >= 0:
                    best, best_first, best_micro, best_new, best_k = score, first, m, new, k
        if best_first < 0:
            continue
        c = sizes[i, best_k]
        if best_new:
            free_tokens -= c * capacity
        across = best_first // per_node != (best_first + c - 1) // per_node
        cost = cost_across[i, best_k] if across else cost_within[i, best_k]
        _take(blocks, i, best_first, c, best_micro, slices[i, best_k], cost, micro)
    _prefer_older(blocks, lengths, sizes, slices, cost_within, cost_across, per_node, micro)
    return blocks


@kernel
def _window_max(values: np.ndarray, c: int, aligned: bool, out: np.ndarray) -> None:
    """``out[j]`` = the largest of ``values[j : j + c]`` for every ``j <= len(values) - c`` (aligned: every ``j``
    a multiple of ``c``), in O(len(values)): free windows by van Herk, Gil and Werman's rule (a window is a
    suffix of one run of ``c`` values and a prefix of the next)."""
    n = values.shape[0]
    if aligned:
        for j in range(0, n - c + 1, c):
            out[j] = values[j : j + c].max()
        return
    suffix = np.empty(n)
    for j in range(n - 1, -1, -1):
        last = j % c == c - 1 or j == n - 1
        suffix[j] = values[j] if last else max(values[j], suffix[j + 1])
    prefix = values[0]
    for end in range(n):
        prefix = values[end] if end % c == 0 else max(prefix, values[end])
        if end >= c - 1:
            out[end - c + 1] = max(suffix[end - c + 1], prefix)


@kernel
def _room(
    blocks: Blocks, first: int, c: int, tokens: np.int64, micro: int, capacity: int, may_open: bool
) -> tuple[int, bool]:
    """The first micro-batch where the block of ``c`` ranks from ``first`` has room for a slice of ``tokens``:
    one of its own, or (``may_open``) one free on all its ranks; and whether it is a new one. (-1, False): none."""
    for m in range(micro):
        slot = first * micro + m
        if blocks.slot_first[slot] == first and blocks.slot_cp[slot] == c:
            if blocks.tokens[slot] + tokens <= capacity:
                return m, False
            continue
        if not may_open or tokens > capacity:
            continue
        free = True
        for r in range(first, first + c):
            if blocks.slot_first[r * micro + m] >= 0:
                free = False
                break
        if free:
            return m, True
    return -1, False


@kernel
def _take(blocks: Blocks, i: int, first: int, c: int, m: int, tokens: np.int64, cost: float, micro: int) -> None:
    for r in range(first, first + c):
        slot = r * micro + m
        blocks.slot_first[slot] = first
        blocks.slot_cp[slot] = c
        blocks.tokens[slot] += tokens
        blocks.rank_cost[r] += cost
    blocks.first[i] = first
    blocks.micro[i] = m
    blocks.cp[i] = c


@kernel
def _prefer_older(
    blocks: Blocks,
    lengths: np.ndarray,
    sizes: np.ndarray,
    slices: np.ndarray,
    cost_within: np.ndarray,
    cost_across: np.ndarray,
    per_node: int,
    micro: int,
) -> None:
    """Oldest deferred first: take the place of the newer placed sample at least as long on a block at least its
    least size (the shortest, the newest among equals), which is deferred instead (the module's docstring)."""
    n = lengths.shape[0]
    for a in range(n):
        if blocks.first[a] >= 0:
            continue
        gives_way = -1
        for b in range(a + 1, n):
            if blocks.first[b] < 0 or blocks.cp[b] < sizes[a, 0] or lengths[b] < lengths[a]:
                continue
            if _size_index(sizes, a, blocks.cp[b]) < 0:
                continue  # a size the mode gives b but not a
            if gives_way < 0 or lengths[b] <= lengths[gives_way]:
                gives_way = b
        if gives_way < 0:
            continue
        first, m, c = blocks.first[gives_way], blocks.micro[gives_way], blocks.cp[gives_way]
        ka, kb = _size_index(sizes, a, c), _size_index(sizes, gives_way, c)
        across = first // per_node != (first + c - 1) // per_node
        if across:
            change = cost_across[a, ka] - cost_across[gives_way, kb]
        else:
            change = cost_within[a, ka] - cost_within[gives_way, kb]
        for r in range(first, first + c):
            blocks.tokens[r * micro + m] += slices[a, ka] - slices[gives_way, kb]
            blocks.rank_cost[r] += change
        blocks.first[a], blocks.micro[a], blocks.cp[a] = first, m, c
        blocks.first[gives_way], blocks.micro[gives_way], blocks.cp[gives_way] = -1, -1, 0


@kernel(inline="always")
def _size_index(sizes: np.ndarray, i: int, c: np.int64) -> int:
    for k in range(sizes.shape[1]):
        if sizes[i, k] == c:
            return k
    return -1
