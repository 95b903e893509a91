"""How many samples one source gives to a step: the pure per-source part of a draw.

A source's FIFO holds the lengths of its available samples in topic offset order. Samples are taken
from its head until the source's target is met (the last one may overshoot). With a long-context
quota, the first long samples (length >= min_length) are taken first, looking past short ones,
until the quota is met; then the FIFO is walked from its head again, skipping what was taken, until
the whole target is met. The taken samples are therefore always the first ``a`` long and the first
``b`` short samples: a prefix of each of the two lanes, which the constructor can checkpoint with two
offsets per source. The result depends only on the samples it takes and those before them, never on
how many more are buffered, so a replay gives the same draw however the data arrived.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Take:
    """Samples taken from one source's FIFO: ``positions`` (ascending) into it, and their tokens."""

    positions: np.ndarray
    tokens: int
    long_tokens: int


def _count_to(lengths: np.ndarray, need: float) -> int | None:
    """The fewest leading samples of ``lengths`` with at least ``need`` tokens; None if all are not enough."""
    if need <= 0:
        return 0
    total = np.cumsum(lengths)  # (n,)
    if len(total) == 0 or total[-1] < need:
        return None
    return int(np.searchsorted(total, need, side="left")) + 1


def take_all(available: np.ndarray, min_length: int) -> Take:
    long = available >= min_length
    return Take(np.arange(len(available)), int(available.sum()), int(available[long].sum()))


def take(available: np.ndarray, need: float, need_long: float, min_length: int, long_is_final: bool) -> Take | None:
    """Take from ``available`` (lengths in FIFO order) at least ``need`` tokens, of which at least
    ``need_long`` from samples of ``min_length`` or more. None when the FIFO holds too few samples;
    if ``long_is_final`` (no more samples will come), a long quota that cannot be met takes every long
    sample instead, and the rest of ``need`` is filled as usual."""
    long_positions = np.flatnonzero(available >= min_length) if need_long > 0 else EMPTY  # (l,)
    n_long = _count_to(available[long_positions], need_long)
    if n_long is None:
        if not long_is_final:
            return None
        n_long = len(long_positions)
    first_long = long_positions[:n_long]
    rest = available.copy()
    rest[first_long] = 0  # already taken: counts nothing on the second walk
    n_head = _count_to(rest, need - float(available[first_long].sum()))
    if n_head is None:
        return None
    # first_long is ascending, so this is the sorted union of the head and the long samples past it
    positions = np.concatenate([np.arange(n_head, dtype=np.int64), first_long[first_long >= n_head]])
    chosen = available[positions]
    return Take(positions, int(chosen.sum()), int(chosen[chosen >= min_length].sum()))
