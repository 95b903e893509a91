"""A step's windows read by position: the window samples that are not due (the candidates), what one option
takes from one source's window (``Fill``: its due and chosen samples, then short ones in FIFO order up to
the source's target, then other long ones), and where each of the step's samples lies once they are laid
end to end source by source (``Homes``), so that the micro-batches a packing put them in can be read back
by source."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from pipeline.planning.mixing._composition.values import Slots, SourceWindow
from pipeline.planning.mixing._take import EMPTY


def not_due(
    windows: Mapping[str, SourceWindow], kind: Mapping[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The window positions of every source's samples of ``kind`` that are not due, source by source, with
    their source's index and their age (tokens before them in the FIFO over the source's tokens per step)."""
    parts = [np.flatnonzero(kind[s] & ~w.due) for s, w in windows.items()]
    ages = [w.ahead[p] / w.unit for p, w in zip(parts, windows.values(), strict=True)]
    sources = [np.full(len(p), k) for k, p in enumerate(parts)]
    return np.concatenate([EMPTY, *parts]), np.concatenate([EMPTY, *sources]), np.concatenate([np.zeros(0), *ages])


def lengths_at(windows: Mapping[str, SourceWindow], positions: np.ndarray, source: np.ndarray) -> np.ndarray:
    lengths = [w.lengths[positions[source == k]] for k, w in enumerate(windows.values())]
    return np.concatenate([EMPTY, *lengths])


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


class Homes:
    """The step's samples laid end to end, source by source: the deferred ones, then each window, then what
    the sources without a window give. The kernel's seeds, ``HoleFill.first`` samples and candidates each
    have a home here, so that the micro-batches it put them in can be read back by source."""

    def __init__(
        self, before: Mapping[str, np.ndarray], windows: Mapping[str, SourceWindow], fixed: Mapping[str, np.ndarray]
    ) -> None:
        parts = [("before", s, len(b)) for s, b in before.items()]
        parts += [("window", s, len(w.lengths)) for s, w in windows.items()]
        parts += [("fixed", s, len(fixed[s])) for s in before if s not in windows]
        ends = np.cumsum([n for _, _, n in parts], dtype=np.int64).tolist()
        self.span = {(part, s): (end - n, end) for (part, s, n), end in zip(parts, ends, strict=True)}
        self.size = ends[-1] if ends else 0

    def of(self, part: str, source: str, index: np.ndarray) -> np.ndarray:
        return self.span[part, source][0] + index

    def placement(
        self,
        slots: Slots,
        seed_home: np.ndarray,
        first_home: np.ndarray,
        cand_home: np.ndarray,
        take: Mapping[str, np.ndarray],
    ) -> dict[str, np.ndarray]:
        """``Composed.placement`` of ``slots`` where the sources take ``take`` from their windows."""
        slot = np.full(self.size, -1, np.int64)
        slot[seed_home] = slots.seed
        slot[first_home] = slots.first
        slot[cand_home] = slots.cand
        out = {}
        for (part, s), (begin, end) in self.span.items():
            if part == "before":
                out[s] = slot[begin:end]
            elif part == "window":
                out[s] = np.concatenate([out[s], slot[begin:end][take[s]]])
            else:
                out[s] = np.concatenate([out[s], slot[begin:end]])
        return out
