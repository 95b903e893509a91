"""The arrays the composition kernels (``groups``, ``packing``) take, grouped as numba passes them
(``typing.NamedTuple``s) and made from the values composition passes around (``values``), and the small
kernels both use on a ``Packing``."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pipeline.planning.kernels.jit import kernel
from pipeline.planning.kernels.trees import SlotRooms
from pipeline.planning.mixing._composition.values import HoleFill, Longs
from pipeline.planning.shape import StepShape


class Samples(NamedTuple):
    """Samples to place: the excess (float64), length and source index (int64) of each."""

    excess: np.ndarray
    length: np.ndarray
    source: np.ndarray


class Grid(NamedTuple):
    """The step: ``ranks`` ranks of ``micro_batches`` micro-batches of ``capacity`` tokens."""

    ranks: int
    micro_batches: int
    capacity: int


class Grouping(NamedTuple):
    """What the groups are built from: ``order`` ranks the candidates to group by decreasing excess,
    ``held`` marks candidates already among the seeds; ranks take candidates up to ``level`` of excess,
    give or take ``slack``."""

    order: np.ndarray
    held: np.ndarray
    level: float
    slack: float


class Holes(NamedTuple):
    """``HoleFill`` as the kernels take it: the candidates by increasing length, each source's short filler
    tokens, the samples every option holds that are not seeds (``first``), the step's ``goal`` in tokens,
    and the excess of a sample of ``L`` tokens as ``excess[0]*L*L + excess[1]*L + excess[2]``."""

    by_length: np.ndarray
    filler: np.ndarray
    first: np.ndarray
    goal: float
    excess: np.ndarray


class Packing(NamedTuple):
    """What a kernel built, in place as it goes: the excess per rank, the tokens per rank and micro-batch
    (``bins``), the chosen candidates, each source's allowance left (tokens), and the micro-batch
    ``rank * micro_batches + m`` each seed, candidate and ``first`` sample went into, -1 for none."""

    excess: np.ndarray
    bins: np.ndarray
    chosen: np.ndarray
    left: np.ndarray
    seed_slot: np.ndarray
    cand_slot: np.ndarray
    first_slot: np.ndarray


def as_grid(shape: StepShape) -> Grid:
    return Grid(shape.ranks, shape.micro_batches, shape.tokens_per_micro_batch)


def as_samples(samples: Longs) -> Samples:
    return Samples(samples.excess.astype(np.float64), samples.length.astype(np.int64), samples.source.astype(np.int64))


def as_holes(holes: HoleFill) -> Holes:
    return Holes(
        holes.by_length.astype(np.int64),
        holes.filler.astype(np.float64),
        holes.first.astype(np.int64),
        float(holes.goal),
        np.array(holes.excess, dtype=np.float64),
    )


@kernel
def copy_of(packing: Packing) -> Packing:
    return Packing(
        packing.excess.copy(),
        packing.bins.copy(),
        packing.chosen.copy(),
        packing.left.copy(),
        packing.seed_slot.copy(),
        packing.cand_slot.copy(),
        packing.first_slot.copy(),
    )


@kernel
def take_candidate(packing: Packing, cands: Samples, c: int, r: int, m: int) -> None:
    """Candidate ``c`` into rank ``r``'s micro-batch ``m``."""
    packing.chosen[c] = True
    packing.bins[r, m] += cands.length[c]
    packing.cand_slot[c] = r * packing.bins.shape[1] + m
    packing.excess[r] += cands.excess[c]
    packing.left[cands.source[c]] -= cands.length[c]


@kernel(inline="always")
def token_rooms(bins: np.ndarray, capacity: int) -> SlotRooms:
    """The micro-batches of ``bins`` (tokens by rank and micro-batch) as the room searches read them: composition
    packs tokens only."""
    return SlotRooms(bins.reshape(-1), np.zeros(0, np.int64), bins.shape[1], capacity, 0)


@kernel
def fullest_with_room(bins: np.ndarray, r: int, length: int, capacity: int) -> int:
    """The fullest micro-batch of rank ``r`` with room for ``length`` tokens; -1 if none."""
    best, best_fill = -1, -1
    for m in range(bins.shape[1]):
        held = bins[r, m]
        if held + length <= capacity and held > best_fill:
            best, best_fill = m, held
    return best
