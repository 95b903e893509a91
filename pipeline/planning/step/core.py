"""One step, from what the sources hold to its plan: draw, order the candidates, plan, settle. Pure: no Kafka.

The constructor, the job's final steps and the balance simulator all make their steps here. The core works
on sample lengths and indices only: the caller holds the samples (the constructor's ``SamplePool`` of
``Sample`` objects, the simulator's arrays of sample ids) and maps the indices back to them.

A step's candidates are numbered as ``[deferred..., *taken]``: the samples the step before deferred, in
their priority order, then per source (in the window's order) the samples drawn from its window, in window
order. ``PlannedStep.order`` lists those numbers in the order the scheduler gets them (``candidate_order``).

**Multimodal samples.** A window may carry each sample's vision patches and encoder cost besides its length.
A step whose candidates have patches (under a patch budget) or an encoder cost is planned with both
capacities, tokens and patches a micro-batch, and with each sample's cost as its LLM cost plus its
encoder cost (``plan_step(..., costs=, patches=, patch_capacity=)``); a step of text alone is planned as
before, bit for bit (``plan_with_media``). Composition chooses from lengths, and scores its options with
the plan the step will get, by true costs under both capacities, short of that plan's last search (each load
brought near its own bound, ``even_parts``, which moves no sample in or out of the step); where its packing
(the scheduler's start) puts more patches in a micro-batch than the budget, the newest samples with patches of
that micro-batch leave it and the scheduler places them like any other.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

import numpy as np

from pipeline.planning.mixing import Draw, DrawStatus, Mixer, MixerState, StepMedia
from pipeline.planning.order import candidate_order
from pipeline.planning.scheduler import CostModel, StepPlan
from pipeline.planning.scheduler.context_parallel import CPPlan, CPShape, plan_cp_step
from pipeline.planning.scheduler.media import plan_with_media
from pipeline.planning.shape import StepShape
from pipeline.spec.cost import VisionCostModel
from pipeline.spec.cp_cost import ContextParallelCost
from topics.errors import MixflowError


@dataclass(frozen=True)
class StepWindow:
    """What a step is drawn from. ``available``: per source, in a fixed order, the lengths of the samples it
    holds, in FIFO order. The samples the step before deferred, in priority order: each one's source (an
    index into ``available``) and length.

    Where samples carry images or clips: ``patches`` and ``encoder_costs``, per source and aligned with
    ``available``, each sample's vision patches (int64) and its cost in the vision encoder (float64, in the
    unit of the LLM's cost model; ``VisionCostModel.sample_costs``), and ``deferred_patches`` and
    ``deferred_encoder_costs`` the same of the deferred samples. None (all four): text only. ``sizes``: per
    source, aligned with ``available``, each sample's bytes held (``pool.held_bytes``), for a composition with
    ``window_bytes``; None: no byte limit applies."""

    available: dict[str, np.ndarray]
    deferred_source: np.ndarray
    deferred_lengths: np.ndarray
    patches: dict[str, np.ndarray] | None = None
    encoder_costs: dict[str, np.ndarray] | None = None
    deferred_patches: np.ndarray | None = None
    deferred_encoder_costs: np.ndarray | None = None
    sizes: dict[str, np.ndarray] | None = None

    @property
    def sources(self) -> list[str]:
        return list(self.available)

    def deferred_by_source(self) -> dict[str, np.ndarray]:
        """Per source, the lengths of its deferred samples in priority order (the mixer's ``deferred``)."""
        return {s: self.deferred_lengths[self.deferred_source == k] for k, s in enumerate(self.available)}


@dataclass(frozen=True)
class PlannedStep:
    """A step drawn and planned. ``taken``: per source, the positions in its window that the step drew
    (ascending). ``order``: the candidates in the order planned (see the module docstring), ``lengths``
    theirs in that order, ``plan`` their ranks and micro-batches; ``started``: planned from composition's
    packing too. ``next_state``: the mixer's state for this lane's next step."""

    step: int
    taken: dict[str, np.ndarray]
    order: np.ndarray
    lengths: np.ndarray
    plan: StepPlan | CPPlan
    started: bool
    next_state: MixerState
    patches: np.ndarray | None = None  # the candidates' vision patches in the order planned (None: text)
    encoder_costs: np.ndarray | None = None  # and their encoder costs

    def llm_rank_costs(self, cost_model: CostModel) -> np.ndarray:
        """Each rank's cost in the LLM (float64, by rank)."""
        return self.plan.rank_costs(self.lengths, cost_model)

    def encoder_rank_costs(self) -> np.ndarray:
        """Each rank's cost in the vision encoder (float64, by rank; zeros for text)."""
        if self.encoder_costs is None:
            return np.zeros(self.plan.ranks)
        return self.plan.rank_totals(self.encoder_costs)

    def rank_patches(self) -> np.ndarray:
        """Each rank's vision patches (int64, by rank)."""
        if self.patches is None:
            return np.zeros(self.plan.ranks, np.int64)
        return self.plan.rank_totals(self.patches).astype(np.int64)

    def candidates_of(self, deferred: np.ndarray, held: Mapping[str, np.ndarray]) -> np.ndarray:
        """The candidates in the order planned, for a caller that holds its samples as arrays (of ids, say):
        ``deferred`` the deferred ones in priority order, ``held`` per source those of its window."""
        return np.concatenate([deferred, *(held[s][positions] for s, positions in self.taken.items())])[self.order]


@dataclass(frozen=True)
class StepOutcome:
    """``OK`` with the ``planned`` step; ``WAITING`` for the sources ``waiting_for``; or ``STOP``."""

    status: DrawStatus
    waiting_for: tuple[str, ...] = ()
    planned: PlannedStep | None = None


class NothingFitsError(MixflowError):
    """None of the samples left fits a step."""


@dataclass(frozen=True)
class StepCore:
    """Makes a lane's steps of one shape. ``lanes``: a lane's next step is this many steps on.
    ``from_placement`` False plans composed steps from scratch, not from composition's packing (a
    comparison for the simulator). ``vision``: the vision encoder's cost model, with which whoever builds
    the windows (the constructor's ``SamplePool``, the simulator) computes their ``encoder_costs``; None
    where the job counts only the LLM's cost. ``even_encoder`` False balances multimodal steps on their
    total cost alone, not the encoder's part too (a comparison for the simulator). ``context_parallel``: the
    step's blocks of ranks (``plan_cp_step``, under ``cp_cost``), for a job whose long samples span several
    ranks; its steps are drawn in order (no composition)."""

    shape: StepShape
    cost_model: CostModel
    lanes: int = 1
    from_placement: bool = True
    vision: VisionCostModel | None = None
    even_encoder: bool = True
    context_parallel: CPShape | None = None
    cp_cost: ContextParallelCost | None = None

    def next_step(
        self, mixer: Mixer, state: MixerState, window: StepWindow, exhausted: Collection[str] = ()
    ) -> StepOutcome:
        """Step ``state.step`` drawn by ``mixer`` (its accepted changes applied) from ``window`` and planned."""
        return self.plan(self.draw(mixer, state, window, exhausted), window)

    def draw(self, mixer: Mixer, state: MixerState, window: StepWindow, exhausted: Collection[str] = ()) -> Draw:
        """The first half of ``next_step``: the mixer's draw (composition scoring its options with the
        window's patches and encoder costs, where it has them)."""
        deferred = window.deferred_by_source()
        return mixer.draw(state, window.available, deferred, exhausted, self._media(window), window.sizes)

    def _media(self, window: StepWindow) -> StepMedia | None:
        if window.patches is None or window.encoder_costs is None:
            return None
        n = len(window.deferred_lengths)
        patches = np.zeros(n, np.int64) if window.deferred_patches is None else window.deferred_patches
        encoder = np.zeros(n) if window.deferred_encoder_costs is None else window.deferred_encoder_costs
        of = window.deferred_source
        return StepMedia(
            window.patches,
            window.encoder_costs,
            {s: np.asarray(patches)[of == k] for k, s in enumerate(window.available)},
            {s: np.asarray(encoder)[of == k] for k, s in enumerate(window.available)},
            self.even_encoder,
        )

    def plan(self, draw: Draw, window: StepWindow) -> StepOutcome:
        """The second half of ``next_step``: ``draw`` (of ``window``) planned, and the mixer settled with what
        the plan deferred."""
        if draw.status is not DrawStatus.OK:
            return StepOutcome(draw.status, draw.waiting_for)
        taken = {s: np.asarray(draw.take.get(s, ()), dtype=np.int64) for s in window.available}
        ordered = _Ordered.of(window, taken)
        start = None
        if self.from_placement and draw.placement is not None:  # each candidate's source named only for one
            start = draw.start_for(ordered.source_names(window.sources))
        plan = self._plan(ordered, start)
        kept = ~plan.placed_mask
        deferred, source = ordered.lengths[kept], ordered.source[kept]
        after = draw.settle({s: deferred[source == k] for k, s in enumerate(window.available)})
        next_state = after if self.lanes == 1 else replace(after, step=after.step - 1 + self.lanes)
        planned = ordered.planned(draw.step, taken, plan, start is not None, next_state)
        return StepOutcome(DrawStatus.OK, planned=planned)

    def final_step(self, state: MixerState, window: StepWindow) -> PlannedStep:
        """A step of a job whose sources have all run out: every sample held is a candidate, the mixer only
        moves on a step. Raises ``NothingFitsError`` when none of them fits."""
        taken = {s: np.arange(len(lengths)) for s, lengths in window.available.items()}
        ordered = _Ordered.of(window, taken)
        plan = self._plan(ordered, None)
        if not plan.placed_mask.any():
            msg = f"step {state.step}: none of the {len(ordered.order)} remaining samples fits a step"
            raise NothingFitsError(msg)
        next_state = MixerState(state.step + self.lanes, state.credit, state.long_credit)
        return ordered.planned(state.step, taken, plan, False, next_state)

    def _plan(self, ordered: _Ordered, start: np.ndarray | None) -> StepPlan | CPPlan:
        if self.context_parallel is not None:
            return plan_cp_step(ordered.lengths, self.context_parallel, self.cp_cost)
        media = (ordered.patches, ordered.encoder_costs, self.even_encoder)
        return plan_with_media(ordered.lengths, self.shape, self.cost_model, start, *media)


@dataclass(frozen=True)
class _Ordered:
    """A step's candidates in the order planned: their numbers (see the module docstring), lengths and
    sources (indices into the window's sources), and for a multimodal window their patches and encoder
    costs."""

    order: np.ndarray
    lengths: np.ndarray
    source: np.ndarray
    patches: np.ndarray | None = None
    encoder_costs: np.ndarray | None = None

    @classmethod
    def of(cls, window: StepWindow, taken: dict[str, np.ndarray]) -> _Ordered:
        drawn = [window.available[s][taken[s]] for s in window.available]
        order = candidate_order(len(window.deferred_lengths), drawn)
        lengths = np.concatenate([window.deferred_lengths, *drawn]).astype(np.int64, copy=False)
        source = np.concatenate(
            [window.deferred_source.astype(np.int64, copy=False)]
            + [np.full(len(d), k, dtype=np.int64) for k, d in enumerate(drawn)]
        )
        if window.patches is None or window.encoder_costs is None:
            return cls(order, lengths[order], source[order])
        patches = _gathered(window, window.deferred_patches, window.patches, taken, np.int64)
        encoder_costs = _gathered(window, window.deferred_encoder_costs, window.encoder_costs, taken, np.float64)
        return cls(order, lengths[order], source[order], patches[order], encoder_costs[order])

    def planned(
        self, step: int, taken: dict[str, np.ndarray], plan: StepPlan | CPPlan, started: bool, next_state: MixerState
    ) -> PlannedStep:
        return PlannedStep(
            step, taken, self.order, self.lengths, plan, started, next_state, self.patches, self.encoder_costs
        )

    def source_names(self, names: list[str]) -> list[str]:
        return [names[k] for k in self.source.tolist()]


def _gathered(
    window: StepWindow,
    deferred: np.ndarray | None,
    by_source: dict[str, np.ndarray],
    taken: dict[str, np.ndarray],
    dtype: type,
) -> np.ndarray:
    """The deferred samples' values (0 where not given), then those of the samples taken from each source,
    in candidate numbering."""
    parts = [np.zeros(len(window.deferred_lengths), dtype) if deferred is None else np.asarray(deferred, dtype)]
    parts += [np.asarray(by_source[s], dtype)[taken[s]] for s in window.available]
    return np.concatenate(parts)
