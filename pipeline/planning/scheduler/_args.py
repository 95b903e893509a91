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


def check_costs(costs: object, size: int, name: str = "costs") -> np.ndarray:
    """One finite float cost >= 0 per sample, as contiguous float64."""
    array = np.asarray(costs)
    if array.shape != (size,) or not (
        np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    ):
        msg = f"{name} must be numbers, one per sample ({size}), got {array.dtype} of shape {array.shape}"
        raise ValueError(msg)
    array = np.ascontiguousarray(array, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(array) | (array < 0))
    if bad.size:
        msg = f"{name} must be finite and >= 0, got {name}[{int(bad[0])}] = {float(array[bad[0]])!r}"
        raise ValueError(msg)
    return array


def check_patches(patches: object, size: int, patch_capacity: object) -> tuple[np.ndarray | None, int]:
    """Each sample's vision patches (int, >= 0, at most ``patch_capacity`` where that is > 0) as contiguous
    int64 or None, and the capacity as an int >= 0 (0: no limit)."""
    if isinstance(patch_capacity, bool) or not isinstance(patch_capacity, numbers.Integral) or patch_capacity < 0:
        msg = f"patch_capacity must be an integer >= 0 (0: no limit), got {patch_capacity!r}"
        raise ValueError(msg)
    if patches is None:
        return None, int(patch_capacity)
    array = np.asarray(patches)
    if array.shape != (size,) or not np.issubdtype(array.dtype, np.integer):
        msg = f"patches must be integers, one per sample ({size}), got {array.dtype} of shape {array.shape}"
        raise ValueError(msg)
    array = np.ascontiguousarray(array, dtype=np.int64)
    if array.size and int(array.min()) < 0:
        first = int(np.flatnonzero(array < 0)[0])
        msg = f"patches must be >= 0, got patches[{first}] = {int(array[first])}"
        raise ValueError(msg)
    if patch_capacity > 0 and array.size and int(array.max()) > patch_capacity:
        too_many = np.flatnonzero(array > patch_capacity)
        first = int(too_many[0])
        msg = (
            f"patches[{first}] = {int(array[first])} exceeds patch_capacity {patch_capacity}"
            f" ({too_many.size} sample(s) with more patches than a micro-batch holds)"
        )
        raise ValueError(msg)
    return array, int(patch_capacity)
