"""What one option takes from one source: its due and chosen samples, then short ones in FIFO order up to the
source's target, then other long ones."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from pipeline.planning.mixing._compose_types import SourceWindow
from pipeline.planning.mixing._take import EMPTY


@dataclass(frozen=True)
class FillOrder:
    """What every option's fill of one source shares: its due samples and their tokens, and its short
    samples that are not due (the filler, in FIFO order) with their running token total (float64: exact
    for any count of tokens below 2**53, and a float ``need`` then searches it without a cast)."""

    due: np.ndarray
    due_tokens: int
    short: np.ndarray
    short_total: np.ndarray
    size: int  # samples in the window

    @classmethod
    def of(cls, window: SourceWindow, is_long: np.ndarray) -> FillOrder:
        short = np.flatnonzero(~window.due & ~is_long)
        total = np.cumsum(window.lengths[short]).astype(np.float64)
        due_tokens = int(window.lengths[window.due].sum())
        return cls(np.flatnonzero(window.due), due_tokens, short, total, len(window.lengths))


@dataclass(frozen=True)
class Fill:
    """One option's take from one source, by part: its chosen long samples, the first ``shorts`` of the
    filler, and other long samples (``extra``) when the filler ran out; ``tokens`` in all."""

    chosen: np.ndarray
    shorts: int
    extra: np.ndarray
    tokens: int
    order: FillOrder

    @cached_property
    def positions(self) -> np.ndarray:
        """The positions taken, ascending (a mask over the window: at 10k ranks a sort of the parts took
        60 ms)."""
        taken = np.zeros(self.order.size, dtype=bool)
        for part in (self.order.due, self.chosen, self.order.short[: self.shorts], self.extra):
            taken[part] = True
        return np.flatnonzero(taken)


def fill(
    window: SourceWindow, is_long: np.ndarray, chosen: np.ndarray, order: FillOrder, to_target: bool = True
) -> Fill:
    """What to take from one source: the due samples and the ``chosen`` ones (long, not due), then, with
    ``to_target``, short samples in FIFO order, then other long ones in FIFO order, while the source's
    remaining tokens are not exceeded."""
    if not to_target:  # a packing: what it chose is what fits, and it goes to the scheduler whole
        return Fill(chosen, 0, EMPTY, order.due_tokens + int(window.lengths[chosen].sum()), order)
    chosen_tokens = int(window.lengths[chosen].sum())
    need = window.remaining - float(order.due_tokens + chosen_tokens)
    n = 0
    if need > 0:
        n = int(np.searchsorted(order.short_total, need, side="right"))
        need -= float(order.short_total[n - 1]) if n else 0.0
    extra = EMPTY
    if need > 0:
        picked = window.due.copy()
        picked[chosen] = True
        picked[order.short[:n]] = True
        lane = np.flatnonzero(~picked & is_long)
        total = np.cumsum(window.lengths[lane])
        extra = lane[: int(np.searchsorted(total, need, side="right"))]
    shorts = int(order.short_total[n - 1]) if n else 0
    return Fill(chosen, n, extra, order.due_tokens + chosen_tokens + shorts + int(window.lengths[extra].sum()), order)
