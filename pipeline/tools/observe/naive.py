"""Naive per-rank loading, the baseline a job's balance is compared with: each rank loads its own share of the
samples (sample ``i`` to rank ``i mod R``, as a ``DistributedSampler`` deals them) and packs them first-fit into its
micro-batches, under the patch budget too where samples carry images or clips. Pure.

A step's samples alone (``naive_loading``) show how naive loading would have spread *those* samples, but a
sample that fits no micro-batch of its rank is left out of that figure, so its figure is of fewer samples
(at a multimodal job's patch budget, a tenth of them or more). A per-rank loader does not drop such a sample:
it loads it in its next step. ``NaiveStream`` runs naive loading so over a whole job: each step deals the
samples written in it, each rank packs what it holds waiting first, then its new samples, and what fits none
of its micro-batches waits for its next step. Its steps are fuller than the per-step figure's; it may need steps
more than the job to load the same samples (``drain``: nearly empty steps, counted in its time but not in its
figures), and the sum of its steps' largest rank cost against the job's is the time naive loading takes for the
same samples."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.spec.cost import CostModel
from pipeline.tools.observe.vision_parts import RankParts, StepVision


def first_fit(
    lengths: np.ndarray,
    bins: int,
    capacity: int,
    patches: np.ndarray | None = None,
    patch_capacity: int | None = None,
) -> np.ndarray:
    """The bin of each sample, packed in order into the first of ``bins`` bins of ``capacity`` tokens with
    room for it (and, with ``patches``, room for its vision patches under ``patch_capacity``, None: no
    limit); -1 for a sample that fits in none."""
    if patches is None:
        return _first_fit_tokens(np.asarray(lengths, dtype=np.int64), bins, capacity)
    room = np.full(bins, capacity, dtype=np.int64)
    patch_room = np.full(bins, np.iinfo(np.int64).max if patch_capacity is None else patch_capacity, dtype=np.int64)
    out = np.full(len(lengths), -1, dtype=np.int64)
    sizes = zip(np.asarray(lengths, dtype=np.int64).tolist(), np.asarray(patches, dtype=np.int64).tolist(), strict=True)
    for i, (length, n) in enumerate(sizes):
        fits = np.flatnonzero((room >= length) & (patch_room >= n))
        if fits.size:
            out[i] = fits[0]
            room[fits[0]] -= length
            patch_room[fits[0]] -= n
    return out


def _first_fit_tokens(lengths: np.ndarray, bins: int, capacity: int) -> np.ndarray:
    room = np.full(bins, capacity, dtype=np.int64)
    out = np.full(len(lengths), -1, dtype=np.int64)
    for i, length in enumerate(lengths.tolist()):
        fits = np.flatnonzero(room >= length)
        if fits.size:
            out[i] = fits[0]
            room[fits[0]] -= length
    return out


@dataclass(frozen=True)
class NaiveLoading:
    """One step of naive per-rank loading: each rank's cost of the samples it packed, the tokens packed, and the
    samples that fit no micro-batch of their rank (left out of a step alone; in a stream, waiting for the
    rank's next step). With media, each rank's encoder and LLM cost too (``parts``)."""

    rank_costs: np.ndarray  # (R,) cost of the samples each rank packed
    tokens: int  # tokens packed in all
    left_out: int  # samples that fit in no micro-batch of their rank
    parts: RankParts | None = None  # with media: each rank's encoder and LLM cost


def naive_loading(
    lengths: np.ndarray,
    ranks: int,
    micro_batches: int,
    capacity: int,
    cost: CostModel,
    vision: StepVision | None = None,
) -> NaiveLoading:
    """Naive per-rank loading of one step's ``lengths`` alone (in the step's order, sample ``i`` to rank ``i mod
    R``; a sample that fits no micro-batch is left out): the first step of a ``NaiveStream``."""
    return NaiveStream(cost).step(lengths, ranks, micro_batches, capacity, vision)


@dataclass
class _Waiting:
    """A rank's samples waiting for its next step, oldest first."""

    lengths: np.ndarray
    patches: np.ndarray
    encoder_costs: np.ndarray

    @classmethod
    def none(cls) -> _Waiting:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))

    def then(self, lengths: np.ndarray, patches: np.ndarray, encoder_costs: np.ndarray) -> _Waiting:
        return _Waiting(
            np.concatenate([self.lengths, lengths]),
            np.concatenate([self.patches, patches]),
            np.concatenate([self.encoder_costs, encoder_costs]),
        )

    def take(self, keep: np.ndarray) -> _Waiting:
        return _Waiting(self.lengths[keep], self.patches[keep], self.encoder_costs[keep])


REPORT_BACKLOG_STEPS = 64
"""Steps of a rank's tokens that naive loading holds waiting at most in a job's report: naive loading that packs
worse than the job falls behind by a share of every step, and a long job's report would hold all of it."""


class NaiveStream:
    """Naive per-rank loading over a job's steps (the module docstring): ``step`` deals a written step's samples
    and packs each rank's next step; ``drain`` the steps it takes for what still waits. A rank keeps at most
    ``backlog_steps`` steps of its tokens waiting (None: all); samples past it are dropped from the stream and
    counted (``dropped``), so that a long-running view holds bounded memory."""

    def __init__(self, cost: CostModel, backlog_steps: float | None = None) -> None:
        self.cost = cost
        self.backlog_steps = backlog_steps
        self.dealt = 0
        self.dropped = 0
        self._waiting: list[_Waiting] = []
        self._shape: tuple[int, int, int] | None = None
        self._vision: tuple[int | None, bool] | None = None  # patch capacity, encoder in the total

    @property
    def waiting(self) -> int:
        """Samples waiting for a rank's next step."""
        return sum(len(w.lengths) for w in self._waiting)

    def step(
        self, lengths: np.ndarray, ranks: int, micro_batches: int, capacity: int, vision: StepVision | None = None
    ) -> NaiveLoading:
        """Naive loading's next step, once a step of ``lengths`` (and their ``vision`` side, None: text) is written:
        sample ``i`` of the job to rank ``i mod ranks``, each rank packing what waits first, then its new
        samples, first-fit into ``micro_batches`` of ``capacity`` tokens (and the patch budget)."""
        if self._shape is None or self._shape[0] != ranks:
            self._waiting = [_Waiting.none() for _ in range(ranks)]
        self._shape = (ranks, micro_batches, capacity)
        if vision is not None:
            self._vision = (vision.patch_capacity, vision.in_total)
        lengths = np.asarray(lengths, dtype=np.int64)
        patches = np.zeros(lengths.size, np.int64) if vision is None else vision.patches
        encoder = np.zeros(lengths.size) if vision is None else vision.encoder_costs
        rank_of = (self.dealt + np.arange(lengths.size)) % ranks
        self.dealt += lengths.size
        for r in range(ranks):
            mine = rank_of == r
            self._waiting[r] = self._waiting[r].then(lengths[mine], patches[mine], encoder[mine])
        return self._pack()

    def drain(self, most_steps: int = 100_000) -> list[NaiveLoading]:
        """The steps naive loading takes for the samples still waiting (at most ``most_steps``; none where a sample
        fits no micro-batch even alone)."""
        out: list[NaiveLoading] = []
        while self.waiting and len(out) < most_steps:
            step = self._pack()
            if step.tokens == 0:
                break
            out.append(step)
        return out

    def _pack(self) -> NaiveLoading:
        assert self._shape is not None
        ranks, micro_batches, capacity = self._shape
        patch_capacity, in_total = self._vision if self._vision is not None else (None, False)
        llm, encoder = np.zeros(ranks), np.zeros(ranks)
        tokens, left_out = 0, 0
        for r, waiting in enumerate(self._waiting):
            patches = None if self._vision is None else waiting.patches
            placed = first_fit(waiting.lengths, micro_batches, capacity, patches, patch_capacity) >= 0
            llm[r] = float(self.cost.costs(waiting.lengths[placed]).sum())
            encoder[r] = float(waiting.encoder_costs[placed].sum())
            tokens += int(waiting.lengths[placed].sum())
            left_out += int((~placed).sum())
            self._waiting[r] = self._within_backlog(waiting.take(~placed), micro_batches * capacity)
        if self._vision is None:
            return NaiveLoading(llm, tokens, left_out)
        parts = RankParts(encoder, llm)
        return NaiveLoading(parts.total(in_total), tokens, left_out, parts)

    def _within_backlog(self, waiting: _Waiting, rank_tokens: int) -> _Waiting:
        if self.backlog_steps is None:
            return waiting
        kept = np.cumsum(waiting.lengths) <= self.backlog_steps * rank_tokens
        self.dropped += int((~kept).sum())
        return waiting.take(kept)
