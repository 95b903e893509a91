"""A binary min-heap of integer ids keyed by an outside array (the trees both planners search are in
``pipeline.planning.kernels.trees``).

An id ``a`` comes before ``b`` when its key is smaller, or the keys are equal and ``a < b``: ties are
broken by id, so the order never depends on how floats happen to compare on a machine.
"""

from __future__ import annotations

import numpy as np

from pipeline.planning.kernels.jit import kernel


@kernel(inline="always")
def _before(key: np.ndarray, a: np.int64, b: np.int64) -> bool:
    # Bitwise rather than short-circuit operators: no branch to mispredict.
    return (key[a] < key[b]) | ((key[a] == key[b]) & (a < b))


@kernel
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


@kernel
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


@kernel
def pop(heap: np.ndarray, size: int, key: np.ndarray) -> tuple[np.int64, int]:
    """Remove the first item; returns it and the new size."""
    first = heap[0]
    size -= 1
    if size > 0:
        heap[0] = heap[size]
        sift_down(heap, size, 0, key)
    return first, size
