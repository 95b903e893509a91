"""The candidates not taken yet, in order of length, as two path-compressed lists: the first free position
at or after ``j``, and the last at or before it."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pipeline.planning.kernels.jit import kernel


class Free(NamedTuple):
    """``by_length`` lists the candidates by increasing length and ``length`` holds their lengths in that
    order; ``next_free(up, j)`` is the first free position ``>= j`` (``n`` for none), and
    ``next_free(down, p + 1) - 1`` the last ``<= p`` (``down`` is shifted by one: 0 is "none")."""

    by_length: np.ndarray
    length: np.ndarray
    up: np.ndarray
    down: np.ndarray


@kernel
def free_lists(by_length: np.ndarray, cand_length: np.ndarray) -> Free:
    n = len(by_length)
    length = np.empty(n, np.int64)
    for j in range(n):
        length[j] = cand_length[by_length[j]]
    return Free(by_length, length, np.arange(n + 1), np.arange(n + 1))


@kernel
def next_free(skip: np.ndarray, j: int) -> int:
    """The first position >= ``j`` not taken yet in a path-compressed list ``skip``."""
    root = j
    while skip[root] != root:
        root = skip[root]
    while skip[j] != root:
        nxt = skip[j]
        skip[j] = root
        j = nxt
    return root


@kernel
def drop_position(free: Free, j: int) -> None:
    """Take position ``j`` out of both lists."""
    free.up[j] = j + 1
    free.down[j + 1] = j


@kernel
def longest_free(free: Free, limit: float, left: np.ndarray, source: np.ndarray) -> int:
    """One past the position of the longest free candidate of at most ``limit`` tokens whose source has
    allowance ``left``, or 0 for none; candidates of sources without allowance are dropped on the way (an
    allowance only shrinks)."""
    p = next_free(free.down, int(np.searchsorted(free.length, limit, side="right")))
    while p > 0 and left[source[free.by_length[p - 1]]] <= 0:
        drop_position(free, p - 1)
        p = next_free(free.down, p - 1)
    return p
