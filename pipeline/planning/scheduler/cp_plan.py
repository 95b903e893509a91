"""A context-parallel step's shape (``CPShape``: ranks, micro-batches, a rank's tokens, the mode and its largest
block) and plan (``CPPlan``: each sample's block's first rank, size and micro-batch, with what the step costs
each rank and how long it takes). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from pipeline.spec.cost import CostModel
from pipeline.spec.cp_cost import ContextParallelCost


class CPMode(StrEnum):
    STATIC = "static"
    ALIGNED = "aligned"
    FREE = "free"


@dataclass(frozen=True)
class CPShape:
    """A step of ``ranks`` ranks (every data-parallel x context-parallel rank) of ``micro_batches`` micro-batches
    of at most ``capacity`` tokens a rank, so at most ``ranks * micro_batches * capacity`` tokens; blocks of the
    ``mode`` up to ``size`` ranks (static: exactly). A block micro-batch takes a slot on each of its ranks
    whatever its slices fill of it, so with blocks of several sizes a rank may run up to ``max_micro_batches``
    micro-batches (default: twice ``micro_batches``; static: ``micro_batches``), ranks different numbers."""

    ranks: int
    micro_batches: int
    capacity: int
    mode: CPMode
    size: int
    max_micro_batches: int = 0

    def __post_init__(self) -> None:
        if self.max_micro_batches == 0:
            wider = self.micro_batches if self.mode is CPMode.STATIC else 2 * self.micro_batches
            object.__setattr__(self, "max_micro_batches", wider)
        if self.max_micro_batches < self.micro_batches:
            msg = f"max_micro_batches {self.max_micro_batches} is below micro_batches {self.micro_batches}"
            raise ValueError(msg)
        for name in ("ranks", "micro_batches", "capacity", "size", "max_micro_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                msg = f"{name} must be an integer >= 1, got {value!r}"
                raise ValueError(msg)
        if self.size > self.ranks:
            msg = f"context-parallel size {self.size} is more than the step's {self.ranks} ranks"
            raise ValueError(msg)
        if self.mode is not CPMode.FREE and self.size & (self.size - 1):
            msg = f"context-parallel size {self.size} must be a power of two in {self.mode.value} mode"
            raise ValueError(msg)
        if self.mode is CPMode.STATIC and self.ranks % self.size:
            msg = f"{self.ranks} ranks are not whole blocks of {self.size} (static mode)"
            raise ValueError(msg)

    def sizes(self) -> list[int]:
        """The block sizes a sample may have, smallest first."""
        if self.mode is CPMode.STATIC:
            return [self.size]
        if self.mode is CPMode.ALIGNED:
            return [1 << k for k in range(self.size.bit_length()) if (1 << k) <= self.size]
        return list(range(1, self.size + 1))


@dataclass(frozen=True, eq=False)
class CPPlan:
    """Where each sample goes: ``rank[i]``, the first rank of its block (-1 when deferred), ``cp[i]`` the block's
    size, ``micro[i]`` its micro-batch on every rank of the block (int32)."""

    rank: np.ndarray
    cp: np.ndarray
    micro: np.ndarray
    shape: CPShape

    @property
    def placed_mask(self) -> np.ndarray:
        return self.rank >= 0

    @property
    def ranks(self) -> int:
        return self.shape.ranks

    def slots(self) -> tuple[np.ndarray, np.ndarray]:
        """One entry a placed sample and rank of its block: the sample's index and the rank's place in the block
        (int64, samples in order, each one's ranks first to last); its rank is ``rank[sample] + place``."""
        placed = np.flatnonzero(self.placed_mask)
        cp = self.cp[placed].astype(np.int64)
        return np.repeat(placed, cp), np.arange(int(cp.sum())) - np.repeat(np.cumsum(cp) - cp, cp)

    def rank_totals(self, values: np.ndarray) -> np.ndarray:
        """Per rank, the sum of ``values`` (one per sample) over its samples, each split evenly over its block."""
        sample, place = self.slots()
        share = np.asarray(values, np.float64)[sample] / self.cp[sample]
        return np.bincount(self.rank[sample] + place, weights=share, minlength=self.shape.ranks)

    def rank_costs(self, lengths: np.ndarray, cost_model: CostModel) -> np.ndarray:
        """Each rank's share of its samples' compute under ``cost_model`` (a sample's cost split over its block;
        ``rank_times`` adds the ring traffic)."""
        return self.rank_totals(cost_model.costs(np.asarray(lengths)))

    def rank_times(self, lengths: np.ndarray, cost: ContextParallelCost) -> np.ndarray:
        """Seconds of every rank's samples (each of its block's ranks pays a sample's per-rank cost)."""
        return self.micro_times(lengths, cost).sum(axis=1)

    def micro_times(self, lengths: np.ndarray, cost: ContextParallelCost) -> np.ndarray:
        """Seconds of every rank's every micro-batch, shape (ranks, max_micro_batches)."""
        placed = np.flatnonzero(self.placed_mask)
        first, cp = self.rank[placed].astype(np.int64), self.cp[placed].astype(np.int64)
        per_rank = cost.per_rank(np.asarray(lengths)[placed], cp, cost.within_node(first, cp))
        micro, first, cp, own = self.block_micro_batches()
        block_time = np.bincount(own, weights=per_rank, minlength=first.size)
        ranks, micro_batches = self.shape.ranks, self.shape.max_micro_batches
        slot = _block_ranks(first, cp) * micro_batches + np.repeat(micro, cp)
        times = np.bincount(slot, np.repeat(block_time, cp), minlength=ranks * micro_batches)
        return times.astype(np.float64).reshape(ranks, micro_batches)  # bincount of nothing is int64

    def block_micro_batches(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The block micro-batches the plan uses, by micro-batch then first rank: each one's micro-batch, first
        rank and size (int64); and each placed sample's (in order), an index into them."""
        placed = np.flatnonzero(self.placed_mask)
        width = self.shape.ranks + 1
        key = (self.micro[placed].astype(np.int64) * width + self.rank[placed]) * width + self.cp[placed]
        block, own = np.unique(key, return_inverse=True)
        return block // (width * width), block // width % width, block % width, own

    def tokens_per_second(self, lengths: np.ndarray, cost: ContextParallelCost) -> float:
        """The tokens placed over the step's time (0 for an empty plan)."""
        time = self.step_time(lengths, cost)
        return float(np.asarray(lengths)[self.placed_mask].sum()) / time if time > 0 else 0.0

    def step_time(self, lengths: np.ndarray, cost: ContextParallelCost) -> float:
        """Seconds of the step when every rank runs its micro-batches in order and a block's ranks start a block
        micro-batch together (each waits for the last of them to be ready)."""
        return self.step_time_of(self.micro_times(lengths, cost))

    def step_time_of(self, times: np.ndarray) -> float:
        """``step_time`` of given seconds of every rank's every micro-batch (shape (ranks, max_micro_batches);
        ``micro_times``' or measured ones)."""
        ready = np.zeros(self.shape.ranks + 1)  # one more: where the last block ends
        micro, first, c, _ = self.block_micro_batches()  # a micro-batch's blocks never overlap
        bounds = np.searchsorted(micro, np.arange(self.shape.max_micro_batches + 1))
        for m in range(self.shape.max_micro_batches):
            f, n = first[bounds[m] : bounds[m + 1]], c[bounds[m] : bounds[m + 1]]
            if f.size:
                latest = np.maximum.reduceat(ready, np.stack([f, f + n], axis=1).ravel())[::2]
                ready[_block_ranks(f, n)] = np.repeat(latest, n)
            ready[:-1] += times[:, m]
        return float(ready[:-1].max())


def _block_ranks(first: np.ndarray, cp: np.ndarray) -> np.ndarray:
    """The ranks of every block, block after block: ``first[k] .. first[k] + cp[k] - 1`` for each ``k``."""
    ends = np.cumsum(cp)
    return np.repeat(first - ends + cp, cp) + np.arange(int(ends[-1]) if ends.size else 0)
