"""Argument checks at the Python boundary of the scheduler: ValueError naming the argument and value."""

from __future__ import annotations

import numbers

import numpy as np


def check_positive_int(name: str, value: object, upper: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        msg = f"{name} must be an integer >= 1, got {value!r}"
        raise ValueError(msg)
    if upper is not None and value > upper:
        msg = f"{name} must be <= {upper}, got {value!r}"
        raise ValueError(msg)
    return int(value)


def check_lengths(lengths: object) -> np.ndarray:
    """A 1-D array of non-negative integer lengths, as contiguous int64."""
    array = np.asarray(lengths)
    if array.ndim != 1:
        msg = f"lengths must be 1-D, got shape {array.shape}"
        raise ValueError(msg)
    if not np.issubdtype(array.dtype, np.integer):
        msg = f"lengths must have an integer dtype, got {array.dtype}"
        raise ValueError(msg)
    array = np.ascontiguousarray(array, dtype=np.int64)
    if array.size and int(array.min()) < 0:  # the index is looked for only on error
        first = int(np.flatnonzero(array < 0)[0])
        msg = f"lengths must be >= 0, got lengths[{first}] = {int(array[first])}"
        raise ValueError(msg)
    return array


def check_step(
    lengths: object, ranks: object, micro_batches: object, capacity: object
) -> tuple[np.ndarray, int, int, int]:
    """The arguments of a step's plan, checked: lengths as contiguous int64, none longer than a micro-batch."""
    lengths = check_lengths(lengths)
    ranks = check_positive_int("ranks", ranks)
    micro_batches = check_positive_int("micro_batches", micro_batches)
    capacity = check_positive_int("capacity", capacity, upper=2**31 - 1)
    if lengths.size and int(lengths.max()) > capacity:  # the index is looked for only on error
        too_long = np.flatnonzero(lengths > capacity)
        first = int(too_long[0])
        msg = (
            f"lengths[{first}] = {int(lengths[first])} exceeds capacity {capacity}"
            f" ({too_long.size} sample(s) longer than a micro-batch; split them first)"
        )
        raise ValueError(msg)
    return lengths, ranks, micro_batches, capacity
