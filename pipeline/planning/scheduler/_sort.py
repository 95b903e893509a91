"""The candidates longest first: one stable sort shared by every phase, which then reads samples in order.

Lengths are bounded integers, so a counting sort does it in two passes; where a few very long samples
would make its buckets outnumber the samples, a comparison sort does. Cost grows with length, so the
order is also by cost. With two capacities (multimodal samples, whose encoder cost does not follow their
length) the candidates go costliest first instead (``costliest_first``).
"""

from __future__ import annotations

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.scheduler._placement import Samples


@kernel
def _counting_sort(
    lengths: np.ndarray, costs: np.ndarray, limit: int, longest: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    end = np.zeros(longest + 1, np.int64)  # by bucket ``longest - length``: its end, once the starts are known
    for i in range(limit):
        end[longest - lengths[i]] += 1
    total = 0
    for bucket in range(longest + 1):
        total += end[bucket]
        end[bucket] = total - end[bucket]  # the bucket's start, moved to its end as the samples land
    order = np.empty(limit, np.int64)
    for i in range(limit):
        bucket = longest - lengths[i]
        order[end[bucket]] = i
        end[bucket] += 1
    sorted_length = np.empty(limit, np.int32)
    sorted_cost = np.empty(limit, np.float64)
    first = 0
    for bucket in range(longest + 1):
        if end[bucket] > first:
            cost = costs[order[first]]  # one read a length: samples of one length cost the same
            for k in range(first, end[bucket]):  # a plain loop: a slice assignment costs more per (often empty) bucket
                sorted_length[k] = longest - bucket
                sorted_cost[k] = cost
            first = end[bucket]
    return order, sorted_length, sorted_cost


@kernel
def _comparison_sort(lengths: np.ndarray, costs: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    order = np.argsort(-lengths[:limit], kind="mergesort")
    sorted_length = np.empty(limit, np.int32)
    sorted_cost = np.empty(limit, np.float64)
    for k in range(limit):
        sorted_length[k] = lengths[order[k]]
        sorted_cost[k] = costs[order[k]]
    return order, sorted_length, sorted_cost


@kernel
def longest_first(
    lengths: np.ndarray, costs: np.ndarray, limit: int, longest: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Samples ``0..limit-1`` (none longer than ``longest``) by decreasing length, ties by increasing index:
    ``order`` (position -> sample), and the length (int32: lengths fit a micro-batch) and cost at each
    position, the costs being those given by sample. (Each sort is a function of its own: with both in one,
    numba compiles the counting sort to slower code.)"""
    if longest > 4 * limit + 65536:
        return _comparison_sort(lengths, costs, limit)
    return _counting_sort(lengths, costs, limit, longest)


@kernel
def costliest_first(samples: Samples, limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Samples ``0..limit-1`` by decreasing cost, ties by increasing index, with two capacities (where cost
    no longer follows length): ``order`` and the length (int32), cost, patches and encoder cost (empty where
    the samples have none) at each position."""
    order = np.argsort(-samples.costs[:limit], kind="mergesort")
    sorted_length = np.empty(limit, np.int32)
    sorted_cost = np.empty(limit, np.float64)
    sorted_patches = np.empty(limit, np.int64)
    sorted_encoder = np.empty(limit if samples.encoder.shape[0] else 0, np.float64)
    for k in range(limit):
        sorted_length[k] = samples.lengths[order[k]]
        sorted_cost[k] = samples.costs[order[k]]
        sorted_patches[k] = samples.patches[order[k]]
    for k in range(sorted_encoder.shape[0]):
        sorted_encoder[k] = samples.encoder[order[k]]
    return order, sorted_length, sorted_cost, sorted_patches, sorted_encoder
