"""Where the step's samples lie, laid end to end source by source (``Homes``), and the window samples that
are not due (the candidates), source by source."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from pipeline.planning.mixing._compose_types import Slots, SourceWindow
from pipeline.planning.mixing._take import EMPTY


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
