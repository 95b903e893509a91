"""A multimodal job's rank costs in two parts, the vision encoder's and the LLM's, from the batches' media
grids (no pixel is decoded). Pure: no Kafka.

A job is multimodal when any of its sources has a ``vision`` section. Each image or clip of ``n`` patches
costs the encoder ``alpha*n^2 + beta*n + gamma`` (``cost.vision``), and a rank's cost is its LLM cost plus
its encoder cost, as the scheduler counts it. A spec without ``cost.vision`` has the scheduler balance the
LLM's cost alone: the encoder's part is then counted in patches and left out of the total.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.planning.scheduler.part_bound import largest_rank_bound
from pipeline.planning.shape import StepShape
from pipeline.spec import JobSpec
from pipeline.spec.cost import VisionCostModel
from topics.formats.batch import Batch

PATCHES = VisionCostModel(alpha=0.0, beta=1.0)
"""The encoder's part of a spec without ``cost.vision``: one per patch."""


@dataclass(frozen=True)
class EncoderWeighing:
    """How the encoder's part of a rank's cost is weighed: by ``model``, added to the LLM's cost when
    ``in_total`` (the spec's ``cost.vision``), or by patches, apart from it."""

    model: VisionCostModel
    in_total: bool

    @classmethod
    def for_spec(cls, spec: JobSpec) -> EncoderWeighing | None:
        """The spec's weighing; None for a job of text sources only."""
        if not any(source.multimodal for source in spec.sources):
            return None
        model = spec.cost.vision_cost_model()
        return cls(PATCHES, in_total=False) if model is None else cls(model, in_total=True)

    @property
    def label(self) -> str:
        """What the encoder's part is called in a report."""
        return "vision encoder" if self.in_total else "vision encoder, in patches (the spec has no cost.vision)"

    @property
    def total_label(self) -> str:
        """What a rank's whole cost is called in a report."""
        return "encoder + LLM" if self.in_total else "total (the LLM's alone)"


@dataclass(frozen=True)
class StepVision:
    """The vision side of a step's samples, in the step's order (rank after rank, each rank's rows):
    each sample's patches and encoder cost, the micro-batches' patch budget (None: none), and whether
    the encoder cost counts in a rank's total."""

    patches: np.ndarray  # (n,) int64
    encoder_costs: np.ndarray  # (n,) float64
    patch_capacity: int | None
    in_total: bool

    def take(self, order: np.ndarray) -> StepVision:
        """The same samples in ``order`` (indices into the step's order)."""
        return StepVision(self.patches[order], self.encoder_costs[order], self.patch_capacity, self.in_total)


def step_vision(batches: Sequence[Batch], encoder: EncoderWeighing) -> StepVision:
    """The vision side of the step whose rank batches are ``batches`` (rank order)."""
    patches, costs = [], []
    for batch in batches:
        media = batch.media
        items = np.diff(media.row_offsets)  # (rows,)
        # bincount sums in float64, exact for counts below 2**53.
        patches.append(np.bincount(media.row, weights=media.patches, minlength=batch.num_samples).astype(np.int64))
        costs.append(encoder.model.sample_costs(media.patches, items))
    return StepVision(
        patches=np.concatenate([np.zeros(0, np.int64), *patches]),
        encoder_costs=np.concatenate([np.zeros(0), *costs]),
        patch_capacity=batches[0].patches_per_micro_batch if batches else None,
        in_total=encoder.in_total,
    )


@dataclass(frozen=True)
class RankParts:
    """Each rank's cost in the vision encoder and in the LLM, (R,) each."""

    encoder: np.ndarray
    llm: np.ndarray

    def total(self, in_total: bool) -> np.ndarray:
        """(R,) each rank's cost: both parts, or the LLM's alone where the encoder's is not ``in_total``."""
        return self.llm + self.encoder if in_total else self.llm


def rank_sums(rank_of: np.ndarray, values: np.ndarray, ranks: int) -> np.ndarray:
    """(R,) the sum of ``values`` over the samples of each rank (``rank_of``: the rank of each)."""
    return np.bincount(rank_of, weights=np.asarray(values, dtype=np.float64), minlength=ranks)


@dataclass(frozen=True)
class PartBounds:
    """Lower bounds of the largest rank cost over every plan of a step's samples on its shape
    (``largest_rank_bound``): of the encoder's part, the LLM's, and the rank's whole cost (``RankParts.total``)."""

    encoder: float
    llm: float
    total: float


def part_bounds(lengths: np.ndarray, llm_costs: np.ndarray, vision: StepVision, shape: StepShape) -> PartBounds:
    """The bounds of a step's samples (``lengths`` tokens and ``llm_costs`` each, ``vision`` their vision side, all
    in the step's order) on ``shape``."""
    lengths, patches = np.asarray(lengths, dtype=np.int64), vision.patches
    encoder = largest_rank_bound(vision.encoder_costs, lengths, patches, shape)
    llm = largest_rank_bound(llm_costs, lengths, patches, shape)
    total = largest_rank_bound(llm_costs + vision.encoder_costs, lengths, patches, shape) if vision.in_total else llm
    return PartBounds(encoder, llm, total)


def over_mean(bound: float, rank_costs: np.ndarray) -> float:
    """``bound`` over the mean of ``rank_costs`` (1 for a step of no cost): the largest / mean rank cost of a plan
    that reached it."""
    mean = float(np.mean(rank_costs))
    return bound / mean if mean > 0 else 1.0
