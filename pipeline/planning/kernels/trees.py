"""Trees over ids (ranks, micro-batches, groups) that the scheduler's and composition's kernels search.

**One tie rule:** every search here returns, among the ids that qualify with the least (or first) key,
the lowest id. So the answer depends only on the keys, never on the shape of a tree or on how floats
happen to compare on a machine.

- ``MinTree``: a tournament tree of float keys over ids ``0..size-1`` (4 children a node); the root holds
  the least key and its id.
- A max segment tree of integers (``set_leaf``, ``leftmost_above``): the lowest position whose value
  exceeds a threshold.
- ``RankTrees``: two binary trees over ranks, the least key and the most room (free tokens of a rank's
  emptiest micro-batch) under each node; ``least_with_room`` finds the rank of least key that has room for
  a sample (the cheapest rank with room, for the scheduler; the rank of least excess, for composition).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pipeline.planning.kernels.jit import kernel


class MinTree(NamedTuple):
    """Node keys and node winners; leaf ``j`` is node ``inner + j``, node 0 the root."""

    keys: np.ndarray  # float64
    ids: np.ndarray  # int64
    inner: int


@kernel
def new_min_tree(size: int) -> MinTree:
    """A tournament tree over ids ``0..size-1``, every key +inf.

    Keys live in the nodes, so an update walks up reading one node's four children at a time: no chain of
    indirect loads, and half the levels of a binary tree (at 4096 ranks, 40% less time an update).
    """
    leaves = 1
    while leaves < size:
        leaves *= 4
    inner = (leaves - 1) // 3
    keys = np.full(inner + leaves, np.inf, np.float64)
    ids = np.empty(inner + leaves, np.int64)
    ids[inner:] = np.arange(leaves)
    for node in range(inner - 1, -1, -1):
        ids[node] = ids[4 * node + 1]
    return MinTree(keys, ids, inner)


@kernel(inline="always")
def set_key(tree: MinTree, item: int, key: float) -> None:
    keys, ids = tree.keys, tree.ids
    node = tree.inner + item
    keys[node] = key
    while node > 0:
        node = (node - 1) >> 2
        first = 4 * node + 1
        # The least of four children, the first among equals: two pairs, then the pairs' winners.
        a = first + np.int64(keys[first + 1] < keys[first])
        b = first + 2 + np.int64(keys[first + 3] < keys[first + 2])
        pick = b if keys[b] < keys[a] else a
        keys[node] = keys[pick]
        ids[node] = ids[pick]


@kernel
def leftmost_above(tree: np.ndarray, leaves: int, start: int, threshold: np.int64) -> int:
    """In a max segment tree (root 1, leaves at ``leaves..2*leaves-1``), the first leaf position
    ``>= start`` whose value exceeds ``threshold``, or -1."""
    node = start + leaves
    while tree[node] <= threshold:
        while node & 1:  # a right child: nothing further right below its parent
            node >>= 1
        if node == 0:
            return -1
        node += 1
    while node < leaves:
        node = 2 * node if tree[2 * node] > threshold else 2 * node + 1
    return node - leaves


@kernel
def set_leaf(tree: np.ndarray, leaves: int, pos: int, value: np.int64) -> None:
    node = pos + leaves
    tree[node] = value
    node >>= 1
    while node >= 1:
        tree[node] = max(tree[2 * node], tree[2 * node + 1])
        node >>= 1


class RankTrees(NamedTuple):
    """Binary trees over ranks (root 1, rank ``r`` at leaf ``leaves + r``): the least key and the most room
    under each node. Padding leaves hold key +inf and room -1: never found."""

    min_key: np.ndarray  # float64
    max_room: np.ndarray  # int64
    leaves: int


@kernel
def rank_trees(key: np.ndarray, room: np.ndarray) -> RankTrees:
    """The trees over ranks ``0..len(key)-1`` with these keys and rooms."""
    leaves = 1
    while leaves < len(key):
        leaves *= 2
    trees = RankTrees(np.full(2 * leaves, np.inf), np.full(2 * leaves, -1, np.int64), leaves)
    for r in range(len(key)):
        trees.min_key[leaves + r] = key[r]
        trees.max_room[leaves + r] = room[r]
    for node in range(leaves - 1, 0, -1):
        trees.min_key[node] = min(trees.min_key[2 * node], trees.min_key[2 * node + 1])
        trees.max_room[node] = max(trees.max_room[2 * node], trees.max_room[2 * node + 1])
    return trees


@kernel
def update_rank(trees: RankTrees, r: int, key: float, room: np.int64) -> None:
    """Set rank ``r``'s key and room, and the nodes above it."""
    min_key, max_room = trees.min_key, trees.max_room
    node = trees.leaves + r
    min_key[node] = key
    max_room[node] = room
    node >>= 1
    while node >= 1:
        min_key[node] = min(min_key[2 * node], min_key[2 * node + 1])
        max_room[node] = max(max_room[2 * node], max_room[2 * node + 1])
        node >>= 1


@kernel
def least_with_room(trees: RankTrees, length: np.int64) -> int:
    """The rank of least key with room ``>= length`` (ties: the lowest rank), or -1.

    A depth-first search that enters the child of lesser key first (the left one on a tie), so that a good
    rank is found early, and prunes a subtree without room, or without a rank that beats the best so far
    by key and then by rank."""
    min_key, max_room, leaves = trees.min_key, trees.max_room, trees.leaves
    best, best_key = -1, np.inf
    stack = np.empty(128, np.int64)
    stack[0] = 1
    depth = 1
    while depth > 0:
        depth -= 1
        node = stack[depth]
        if max_room[node] < length or min_key[node] > best_key:
            continue
        if min_key[node] == best_key and _lowest_rank(node, leaves) > best:
            continue
        if node >= leaves:
            best, best_key = node - leaves, min_key[node]
            continue
        left, right = 2 * node, 2 * node + 1
        if min_key[right] < min_key[left]:
            left, right = right, left
        stack[depth] = right  # popped after the whole of the other child
        stack[depth + 1] = left
        depth += 2
    return best


@kernel(inline="always")
def _lowest_rank(node: int, leaves: int) -> int:
    while node < leaves:
        node *= 2
    return node - leaves
