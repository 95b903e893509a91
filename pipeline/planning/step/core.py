"""One step, from what the sources hold to its plan: draw, order the candidates, plan, settle. Pure: no Kafka.

The constructor, the job's final steps and the balance simulator all make their steps here. The core works
on sample lengths and indices only: the caller holds the samples (the constructor's ``SamplePool`` of
``Sample`` objects, the simulator's arrays of sample ids) and maps the indices back to them.

A step's candidates are numbered as ``[deferred..., *taken]``: the samples the step before deferred, in
their priority order, then per source (in the window's order) the samples drawn from its window, in window
order. ``PlannedStep.order`` lists those numbers in the order the scheduler gets them (``candidate_order``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

import numpy as np

from pipeline.planning.mixing import Draw, DrawStatus, Mixer, MixerState
from pipeline.planning.order import candidate_order
from pipeline.planning.scheduler import CostModel, StepPlan, plan_step
from pipeline.planning.step.spec_change import StepShape
from topics.errors import MixflowError


@dataclass(frozen=True)
class StepWindow:
    """What a step is drawn from. ``available``: per source, in a fixed order, the lengths of the samples it
    holds, in FIFO order. The samples the step before deferred, in priority order: each one's source (an
    index into ``available``) and length."""

    available: dict[str, np.ndarray]
    deferred_source: np.ndarray
    deferred_lengths: np.ndarray

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
    plan: StepPlan
    started: bool
    next_state: MixerState

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
    comparison for the simulator)."""

    shape: StepShape
    cost_model: CostModel
    lanes: int = 1
    from_placement: bool = True

    def next_step(
        self, mixer: Mixer, state: MixerState, window: StepWindow, exhausted: Collection[str] = ()
    ) -> StepOutcome:
        """Step ``state.step`` drawn by ``mixer`` (its accepted changes applied) from ``window`` and planned."""
        return self.plan(self.draw(mixer, state, window, exhausted), window)

    @staticmethod
    def draw(mixer: Mixer, state: MixerState, window: StepWindow, exhausted: Collection[str] = ()) -> Draw:
        """The first half of ``next_step``: the mixer's draw."""
        return mixer.draw(state, window.available, window.deferred_by_source(), exhausted)

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
        plan = self._plan(ordered.lengths, start)
        kept = ~plan.placed_mask
        deferred, source = ordered.lengths[kept], ordered.source[kept]
        after = draw.settle({s: deferred[source == k] for k, s in enumerate(window.available)})
        next_state = after if self.lanes == 1 else replace(after, step=after.step - 1 + self.lanes)
        planned = PlannedStep(draw.step, taken, ordered.order, ordered.lengths, plan, start is not None, next_state)
        return StepOutcome(DrawStatus.OK, planned=planned)

    def final_step(self, state: MixerState, window: StepWindow) -> PlannedStep:
        """A step of a job whose sources have all run out: every sample held is a candidate, the mixer only
        moves on a step. Raises ``NothingFitsError`` when none of them fits."""
        taken = {s: np.arange(len(lengths)) for s, lengths in window.available.items()}
        ordered = _Ordered.of(window, taken)
        plan = self._plan(ordered.lengths, None)
        if not plan.placed_mask.any():
            msg = f"step {state.step}: none of the {len(ordered.order)} remaining samples fits a step"
            raise NothingFitsError(msg)
        next_state = MixerState(state.step + self.lanes, state.credit, state.long_credit)
        return PlannedStep(state.step, taken, ordered.order, ordered.lengths, plan, False, next_state)

    def _plan(self, lengths: np.ndarray, start: np.ndarray | None) -> StepPlan:
        shape = self.shape
        return plan_step(
            lengths, shape.ranks, shape.micro_batches, shape.tokens_per_micro_batch, self.cost_model, start=start
        )


@dataclass(frozen=True)
class _Ordered:
    """A step's candidates in the order planned: their numbers (see the module docstring), lengths and
    sources (indices into the window's sources)."""

    order: np.ndarray
    lengths: np.ndarray
    source: np.ndarray

    @classmethod
    def of(cls, window: StepWindow, taken: dict[str, np.ndarray]) -> _Ordered:
        drawn = [window.available[s][taken[s]] for s in window.available]
        order = candidate_order(len(window.deferred_lengths), drawn)
        lengths = np.concatenate([window.deferred_lengths, *drawn]).astype(np.int64, copy=False)
        source = np.concatenate(
            [window.deferred_source.astype(np.int64, copy=False)]
            + [np.full(len(d), k, dtype=np.int64) for k, d in enumerate(drawn)]
        )
        return cls(order, lengths[order], source[order])

    def source_names(self, names: list[str]) -> list[str]:
        return [names[k] for k in self.source.tolist()]
