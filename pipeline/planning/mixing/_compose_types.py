"""The values step composition passes around: a source's window, long samples, the step's shape, what the
hole packing needs, and what a grouping or packing built."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.planning.mixing._take import EMPTY


@dataclass(frozen=True)
class SourceWindow:
    """One source's window: the head of its FIFO, the tokens before each of its samples in the FIFO,
    which samples are due (must be taken now), the source's tokens per step at its weight, and the
    tokens it is to give this step beyond its deferred samples."""

    lengths: np.ndarray
    ahead: np.ndarray
    due: np.ndarray
    unit: float
    remaining: float


@dataclass(frozen=True)
class Longs:
    """Long samples: ``excess``, ``length`` and ``source`` (an index) of each."""

    excess: np.ndarray
    length: np.ndarray
    source: np.ndarray

    def with_one(self, other: Longs, i: int) -> Longs:
        return Longs(
            np.append(self.excess, other.excess[i]),
            np.append(self.length, other.length[i]),
            np.append(self.source, other.source[i]),
        )


@dataclass(frozen=True)
class StepShape:
    ranks: int
    micro_batches: int
    capacity: int

    @property
    def tokens(self) -> int:
        return self.ranks * self.micro_batches * self.capacity


@dataclass(frozen=True)
class HoleFill:
    """What the grouping kernel needs to pack the holes with window samples where short samples are too
    few: the candidates (long, then short) by increasing length (``by_length``), each source's short
    filler tokens (``filler``: nothing is packed where they cover every allowance), the samples every
    option holds that are not seeds (``first``), the step's ``goal`` in tokens, and the excess of a sample
    of ``L`` tokens as ``(a, b, g)``: ``a*L*L + b*L + g``."""

    by_length: np.ndarray
    filler: np.ndarray
    first: np.ndarray
    goal: float
    excess: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @classmethod
    def none(cls, sources: int) -> HoleFill:
        return cls(EMPTY, np.zeros(sources), EMPTY, 0.0)


@dataclass(frozen=True)
class Slots:
    """The micro-batch (``rank * micro_batches + m``, -1 for none) that a packing put each seed, candidate
    and ``HoleFill.first`` sample into."""

    seed: np.ndarray
    cand: np.ndarray
    first: np.ndarray


@dataclass(frozen=True)
class Groups:
    """What ``build_groups`` built: the chosen candidates (a bool mask), the excess per rank, the tokens per
    rank and micro-batch (``bins``), and the micro-batch (``rank * micro_batches + m``, -1 for none) each
    seed, candidate and ``HoleFill.first`` sample went into."""

    chosen: np.ndarray
    excess: np.ndarray
    bins: np.ndarray
    slots: Slots


@dataclass(frozen=True)
class Composed:
    """``compose_takes``' answer: the positions to take from each source's window, and where the holes were
    packed, the packing: per source, the micro-batch (``rank * micro_batches + m``, -1 for none) of each
    of its deferred samples, then of each sample taken (in FIFO order), as ``Draw.lengths`` lists them."""

    take: dict[str, np.ndarray]
    placement: dict[str, np.ndarray] | None = None
