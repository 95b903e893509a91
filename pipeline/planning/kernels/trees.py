"""Trees over ids (ranks, micro-batches, groups) that the scheduler's and composition's kernels search.

**One tie rule:** every search here returns, among the ids that qualify with the least (or first) key,
the lowest id. So the answer depends only on the keys, never on the shape of a tree or on how floats
happen to compare on a machine.

- ``MinTree``: a tournament tree of float keys over ids ``0..size-1`` (4 children a node); the root holds
  the least key and its id.
- A max segment tree of integers (``set_leaf``, ``leftmost_above``): the lowest position whose value
  exceeds a threshold.
- ``RoomTrees``: binary trees over ranks, the least key and the most room of each kind (free tokens; free
  vision patches where a micro-batch bounds them) of any one of a rank's micro-batches (``SlotRooms``) under
  each node; ``least_with_room`` finds the rank of least key with a micro-batch that has room for a sample
  (the cheapest rank with room, for the scheduler; the rank of least excess, for composition). It is the one
  search both planners make, whatever the kinds of room.
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


@kernel(inline="always")
def rekey_pair(least: MinTree, most: MinTree, pair: tuple[int, int], load: np.ndarray) -> None:
    """Ids ``pair`` keyed by their ``load`` in ``least`` and by minus it in ``most`` (least and most load first),
    after a move or a trade between them."""
    for item in pair:
        set_key(least, item, load[item])
        set_key(most, item, -load[item])


@kernel(inline="always")
def restore_keys(tree: MinTree, skipped: np.ndarray, count: int, load: np.ndarray) -> None:
    """The first ``count`` ids of ``skipped`` (taken out of ``tree`` with an infinite key while others were
    tried) keyed by their ``load`` again."""
    for t in range(count):
        set_key(tree, skipped[t], load[skipped[t]])


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


class SlotRooms(NamedTuple):
    """What each micro-batch holds of each kind of room: tokens, and vision patches where a micro-batch bounds
    them too (``patch_capacity > 0``). Rank ``r``'s micro-batch ``m`` is slot ``r * micro + m``."""

    tokens: np.ndarray  # int64 by slot
    patches: np.ndarray  # int64 by slot; not read where ``patch_capacity`` is 0
    micro: int
    capacity: int  # tokens a micro-batch holds
    patch_capacity: int  # patches a micro-batch holds; 0: tokens only


@kernel(inline="always")
def fits(slots: SlotRooms, slot: np.int64, length: np.int64, patches: np.int64) -> bool:
    """Whether micro-batch ``slot`` has room for ``length`` tokens and ``patches`` patches."""
    return slots.tokens[slot] + length <= slots.capacity and (
        slots.patch_capacity == 0 or slots.patches[slot] + patches <= slots.patch_capacity
    )


@kernel(inline="always")
def first_fit(slots: SlotRooms, r: np.int64, length: np.int64, patches: np.int64) -> int:
    """The first micro-batch of rank ``r`` with room for both, or -1."""
    base = r * slots.micro
    for m in range(slots.micro):
        if fits(slots, base + m, length, patches):
            return m
    return -1


class RoomTrees(NamedTuple):
    """Binary trees over ranks (root 1, rank ``r`` at leaf ``leaves + r``): under each node the least key, its
    rank (the lowest among equal keys), and of each kind of room the most that one micro-batch has free (the
    patch room is 0 with tokens only). Padding leaves hold key +inf and rooms -1: never found. Two arrays, not
    one a field: every array a kernel call takes costs it a reference count."""

    key: np.ndarray  # float64 by node
    node: np.ndarray  # int64 by node and ``RANK``, ``ROOM``, ``PATCH_ROOM``
    leaves: int


RANK, ROOM, PATCH_ROOM = 0, 1, 2


@kernel
def room_trees(key: np.ndarray, slots: SlotRooms) -> RoomTrees:
    """The trees over ranks ``0..len(key)-1`` with these keys and the rooms ``slots`` leave."""
    leaves = 1
    while leaves < len(key):
        leaves *= 2
    node = np.full((2 * leaves, 3), -1, np.int64)
    node[leaves:, RANK] = np.arange(leaves)
    trees = RoomTrees(np.full(2 * leaves, np.inf), node, leaves)
    for r in range(len(key)):
        _set_leaf(trees, slots, r, key[r])
    for n in range(leaves - 1, 0, -1):
        _pull(trees, n)
    return trees


@kernel(inline="always")
def _set_leaf(trees: RoomTrees, slots: SlotRooms, r: int, key: float) -> None:
    base = r * slots.micro
    leaf = trees.leaves + r
    trees.key[leaf] = key
    least = slots.tokens[base]
    for m in range(1, slots.micro):
        least = min(least, slots.tokens[base + m])
    trees.node[leaf, ROOM] = slots.capacity - least
    if slots.patch_capacity > 0:
        least = slots.patches[base]
        for m in range(1, slots.micro):
            least = min(least, slots.patches[base + m])
        trees.node[leaf, PATCH_ROOM] = slots.patch_capacity - least
    else:
        trees.node[leaf, PATCH_ROOM] = 0


@kernel(inline="always")
def _pull(trees: RoomTrees, n: int) -> bool:
    """Node ``n`` from its two children; whether it changed."""
    key, node = trees.key, trees.node
    pick = 2 * n + np.int64(key[2 * n + 1] < key[2 * n])  # the left one on a tie
    room = max(node[2 * n, ROOM], node[2 * n + 1, ROOM])
    patch_room = max(node[2 * n, PATCH_ROOM], node[2 * n + 1, PATCH_ROOM])
    changed = (
        key[n] != key[pick]
        or node[n, RANK] != node[pick, RANK]
        or node[n, ROOM] != room
        or node[n, PATCH_ROOM] != patch_room
    )
    key[n] = key[pick]
    node[n, RANK] = node[pick, RANK]
    node[n, ROOM] = room
    node[n, PATCH_ROOM] = patch_room
    return changed


@kernel(inline="always")
def update_rank(trees: RoomTrees, slots: SlotRooms, r: int, key: float) -> None:
    """Set rank ``r``'s key, and its rooms from ``slots``, and the nodes above it (up to the first that stays
    as it was: the ones above it then do too)."""
    _set_leaf(trees, slots, r, key)
    n = (trees.leaves + r) >> 1
    while n >= 1 and _pull(trees, n):
        n >>= 1


@kernel(inline="always")
def least_with_room(trees: RoomTrees, slots: SlotRooms, length: np.int64, patches: np.int64) -> int:
    """The rank of least key with a micro-batch that has room for ``length`` tokens and ``patches`` patches
    (ties: the lowest rank), or -1.

    The rank of least key most often has room: then it is the answer, with no search. Else a depth-first
    search that enters the child of lesser key first (the left one on a tie), so that a good rank is found
    early, and prunes a subtree without room of either kind, or without a rank that beats the best so far by
    key and then by rank. With tokens only a rank's most free tokens are one micro-batch's, so a leaf with
    room fits; with patches too the two maxima may be two micro-batches', and a leaf is checked micro-batch
    by micro-batch."""
    cheapest = trees.node[1, RANK]
    if _has_room(trees, slots, trees.leaves + cheapest, length, patches):
        return cheapest
    return _search(trees, slots, length, patches)


@kernel(inline="always")
def _has_room(trees: RoomTrees, slots: SlotRooms, n: int, length: np.int64, patches: np.int64) -> bool:
    """Whether the rank of leaf ``n`` has a micro-batch with room for both."""
    if trees.node[n, ROOM] < length or trees.node[n, PATCH_ROOM] < patches:
        return False
    return slots.patch_capacity == 0 or first_fit(slots, n - trees.leaves, length, patches) >= 0


@kernel
def _search(trees: RoomTrees, slots: SlotRooms, length: np.int64, patches: np.int64) -> int:
    key, node, leaves = trees.key, trees.node, trees.leaves
    best, best_key = -1, np.inf
    stack = np.empty(128, np.int64)
    stack[0] = 1
    depth = 1
    while depth > 0:
        depth -= 1
        n = stack[depth]
        if node[n, ROOM] < length or node[n, PATCH_ROOM] < patches or key[n] > best_key:
            continue
        if key[n] == best_key and node[n, RANK] > best:
            continue
        if n >= leaves:
            if _has_room(trees, slots, n, length, patches):
                best, best_key = n - leaves, key[n]
            continue
        left, right = 2 * n, 2 * n + 1
        if key[right] < key[left]:
            left, right = right, left
        stack[depth] = right  # popped after the whole of the other child
        stack[depth + 1] = left
        depth += 2
    return best
