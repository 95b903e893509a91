"""Fitting ``alpha*L^2 + beta*L + gamma`` to timed micro-batches: numpy alone, no torch."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.tools.calibrate.grid import MicroBatchShape


@dataclass(frozen=True)
class Timing:
    """Repeated times of one micro-batch shape, in ms."""

    shape: MicroBatchShape
    ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return float(np.median(self.ms))


@dataclass(frozen=True)
class CostFit:
    """A micro-batch of samples of lengths ``L_i`` takes ``sum(alpha*L_i^2 + beta*L_i + gamma) +
    per_micro_batch`` ms. ``per_micro_batch`` is the same on every rank, so it is no part of the
    balance and not in the spec."""

    alpha: float
    beta: float
    gamma: float
    per_micro_batch: float
    timings: tuple[Timing, ...]

    def predicted_ms(self, shape: MicroBatchShape) -> float:
        length = float(shape.length)
        per_sample = (self.alpha * length) * length + self.beta * length + self.gamma
        return shape.samples * per_sample + self.per_micro_batch

    def scaled(self, factor: float) -> CostFit:
        """The same fit for ``factor`` blocks in a row (every coefficient times ``factor``)."""
        timings = tuple(Timing(t.shape, tuple(ms * factor for ms in t.ms)) for t in self.timings)
        alpha, beta, gamma, fixed = (factor * c for c in (self.alpha, self.beta, self.gamma, self.per_micro_batch))
        return CostFit(alpha, beta, gamma, fixed, timings)

    def relative_errors(self) -> np.ndarray:
        """``predicted / measured - 1`` of each timing's median, in the order of ``timings``."""
        measured = np.array([t.median_ms for t in self.timings])
        predicted = np.array([self.predicted_ms(t.shape) for t in self.timings])
        return predicted / measured - 1

    def r_squared(self) -> float:
        """Of the micro-batch medians."""
        measured = np.array([t.median_ms for t in self.timings])
        predicted = np.array([self.predicted_ms(t.shape) for t in self.timings])
        total = float(np.sum((measured - measured.mean()) ** 2))
        return 1.0 - float(np.sum((measured - predicted) ** 2)) / total if total > 0 else 1.0

    def worst_error_by_length(self) -> dict[int, float]:
        """The largest ``|relative error|`` over the micro-batches of each sample length."""
        worst: dict[int, float] = {}
        for timing, error in zip(self.timings, self.relative_errors(), strict=True):
            length = timing.shape.length
            worst[length] = max(worst.get(length, 0.0), abs(float(error)))
        return dict(sorted(worst.items()))


def fit_cost(timings: Sequence[Timing]) -> CostFit:
    """Fit ``alpha, beta, gamma, per_micro_batch >= 0`` to the timings' medians by least squares relative
    to each median, so short and long micro-batches weigh alike and one slow repeat moves nothing."""
    if not timings:
        msg = "no timings to fit"
        raise ValueError(msg)
    for timing in timings:
        if not timing.ms or not all(np.isfinite(ms) and ms > 0 for ms in timing.ms):
            msg = f"times of {timing.shape} must be finite and > 0 ms, got {timing.ms}"
            raise ValueError(msg)
    lengths = np.array([t.shape.length for t in timings], dtype=np.float64)
    samples = np.array([t.shape.samples for t in timings], dtype=np.float64)
    measured = np.array([t.median_ms for t in timings])
    design = np.stack([samples * lengths**2, samples * lengths, samples, np.ones_like(lengths)], axis=1)
    if np.linalg.matrix_rank(design / np.linalg.norm(design, axis=0)) < design.shape[1]:
        msg = "the micro-batches timed cannot tell alpha, beta, gamma apart: time at least 3 lengths, 2 sizes of one"
        raise ValueError(msg)
    alpha, beta, gamma, fixed = _nonnegative_least_squares(design / measured[:, None], np.ones_like(measured))
    return CostFit(float(alpha), float(beta), float(gamma), float(fixed), tuple(timings))


def _nonnegative_least_squares(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``argmin |a x - b|`` over ``x >= 0``, exactly, for a few columns: the optimum is the unconstrained
    least squares on its own support, so the best non-negative one over all supports is it."""
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    scaled = a / scale
    columns = scaled.shape[1]
    best, best_residual = np.zeros(columns), float(b @ b)
    for size in range(1, columns + 1):
        for support in itertools.combinations(range(columns), size):
            chosen = list(support)
            x, *_ = np.linalg.lstsq(scaled[:, chosen], b, rcond=None)
            if np.any(x < 0):
                continue
            residual = float(np.sum((scaled[:, chosen] @ x - b) ** 2))
            if residual < best_residual:
                best = np.zeros(columns)
                best[chosen] = x
                best_residual = residual
    return best / scale
