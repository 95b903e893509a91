"""Mixture weights over training steps, as arrays: one row of normalised shares per schedule point."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from pipeline.spec.mixture import Interpolation, MixtureSpec


class Schedule:
    """Each source's share of a step's tokens at any step.

    ``steps`` (K,) are the points' first steps, strictly increasing from 0; ``weights`` (K, S) their
    shares, one column per source in ``sources`` order, normalised per row. Constant interpolation
    holds a point's row until the next point; linear moves each share linearly from one point's row
    to the next, so every interpolated row also sums to 1. Both hold the last row after the last point.
    """

    def __init__(
        self,
        sources: Sequence[str],
        steps: ArrayLike,
        weights: ArrayLike,
        interpolation: Interpolation = Interpolation.CONSTANT,
    ) -> None:
        self.sources = tuple(sources)
        self.steps = np.asarray(steps, dtype=np.int64).reshape(-1)
        raw = np.asarray(weights, dtype=np.float64)
        self.interpolation = Interpolation(interpolation)
        if raw.shape != (len(self.steps), len(self.sources)) or len(self.steps) == 0:
            want = (len(self.steps), len(self.sources))
            msg = f"weights must have shape (points, sources) = {want} with points > 0, got {raw.shape}"
            raise ValueError(msg)
        if self.steps[0] != 0 or np.any(np.diff(self.steps) <= 0):
            msg = f"schedule steps must start at 0 and strictly increase, got {self.steps.tolist()}"
            raise ValueError(msg)
        if not np.all(np.isfinite(raw)) or np.any(raw < 0) or np.any(raw.sum(axis=1) <= 0):
            msg = f"weights must be finite, >= 0, and sum to more than 0 per point, got {raw.tolist()}"
            raise ValueError(msg)
        self.weights = raw / raw.sum(axis=1, keepdims=True)  # (K, S)

    @classmethod
    def from_spec(cls, mixture: MixtureSpec, sources: Sequence[str]) -> Schedule:
        """The schedule of a validated ``mixture`` over ``sources`` (in that column order)."""
        points = mixture.points()
        rows = [[shares.get(name, 0.0) for name in sources] for _, shares in points]
        return cls(sources, [step for step, _ in points], rows, mixture.interpolation or Interpolation.CONSTANT)

    def weights_array(self, steps: ArrayLike) -> np.ndarray:
        """Shares at each of ``steps``: shape ``steps.shape + (S,)``."""
        at = np.asarray(steps, dtype=np.int64)
        if at.size and at.min() < 0:
            msg = f"steps must be >= 0, got {int(at.min())}"
            raise ValueError(msg)
        flat = at.reshape(-1)  # (N,)
        point = np.searchsorted(self.steps, flat, side="right") - 1  # (N,) last point at or before
        out = self.weights[point]  # (N, S)
        if self.interpolation is Interpolation.LINEAR and len(self.steps) > 1:
            inner = point < len(self.steps) - 1  # (N,) between two points, not after the last
            p = point[inner]
            t = (flat[inner] - self.steps[p]) / (self.steps[p + 1] - self.steps[p])  # (n,) in [0, 1)
            out[inner] = (1.0 - t)[:, None] * self.weights[p] + t[:, None] * self.weights[p + 1]
        return out.reshape((*at.shape, len(self.sources)))

    def weights_at(self, step: int) -> dict[str, float]:
        """Shares at one step, by source name."""
        return dict(zip(self.sources, self.weights_array(step).tolist(), strict=True))

    def mean_weights(self, start: int, stop: int) -> np.ndarray:
        """Average shares over steps ``start..stop-1``, shape (S,): the share of tokens a source should
        have received over those steps when every step has the same number of tokens."""
        if not 0 <= start < stop:
            msg = f"need 0 <= start < stop, got {start}, {stop}"
            raise ValueError(msg)
        return self.weights_array(np.arange(start, stop)).mean(axis=0)


def schedule_weights(mixture: MixtureSpec, sources: Sequence[str], step: int) -> dict[str, float]:
    """Normalised shares of ``sources`` at ``step`` (builds a ``Schedule``; keep one when calling often)."""
    return Schedule.from_spec(mixture, sources).weights_at(step)
