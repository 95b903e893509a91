"""Rates from counters read over time, smoothed by an exponentially weighted moving average. Pure."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SmoothedRate:
    """The EWMA of a counter's rate of change: each ``update(time, count)`` after the first measures
    ``(count - last count) / (time - last time)`` and moves the average by ``weight`` towards it.
    ``update(..., measure=False)`` moves the reference point without measuring (an interval during
    which the rate does not say what was wanted, e.g. the loaders had no work)."""

    weight: float
    value: float | None = None
    _last: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if not 0 < self.weight <= 1:
            msg = f"weight must be in (0, 1], got {self.weight}"
            raise ValueError(msg)

    def update(self, time: float, count: float, *, measure: bool = True, per: float = 1.0) -> float | None:
        """The smoothed rate after this reading; ``per`` divides the measured rate (e.g. by the loaders)."""
        if self._last is not None and measure and time > self._last[0] and per > 0:
            rate = max(count - self._last[1], 0.0) / (time - self._last[0]) / per
            self.value = rate if self.value is None else self.value + self.weight * (rate - self.value)
        self._last = (time, count)
        return self.value
