"""The values step composition passes around: a source's window, long samples, what the hole packing needs,
what a grouping or packing built, the answer, and a step's media (the step's shape is
``pipeline.planning.shape.StepShape``). The kernels take them as the arrays of ``kernel_arrays``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


@dataclass(frozen=True)
class StepMedia:
    """Where the step's samples carry images or clips: each sample's vision patches and encoder cost, per
    source aligned with its FIFO (``available``) and with its deferred samples, and whether the scheduler
    evens out the encoder's part. Composition then scores its options with the plan such a step gets
    (``plan_with_media``, under the step shape's patch budget)."""

    patches: Mapping[str, np.ndarray]
    encoder_costs: Mapping[str, np.ndarray]
    deferred_patches: Mapping[str, np.ndarray]
    deferred_encoder_costs: Mapping[str, np.ndarray]
    even_encoder: bool = True

    def of_step(self, sources: Sequence[str], positions: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Patches and encoder costs of a step's candidates numbered as ``[*deferred, *drawn]``, source after
        source in ``sources`` order, where each source draws the FIFO ``positions``."""
        patches = [*(self.deferred_patches[s] for s in sources), *(self.patches[s][positions[s]] for s in sources)]
        encoder = [
            *(self.deferred_encoder_costs[s] for s in sources),
            *(self.encoder_costs[s][positions[s]] for s in sources),
        ]
        return (
            np.concatenate([np.zeros(0, np.int64), *patches]).astype(np.int64, copy=False),
            np.concatenate([np.zeros(0), *encoder]).astype(np.float64, copy=False),
        )
