"""A job's mixer: its schedule, step budget and policies, built from the spec."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import ArrayLike

from pipeline.planning.mixing._composition.values import StepMedia
from pipeline.planning.mixing.changes import MixtureChange, MixtureTimeline
from pipeline.planning.mixing.compose import compose_step
from pipeline.planning.mixing.draw import Draw, LongContext, draw_step
from pipeline.planning.mixing.schedule import Schedule
from pipeline.planning.mixing.state import MixerState
from pipeline.planning.scheduler import CostModel
from pipeline.planning.shape import StepShape
from pipeline.spec.job import JobSpec
from pipeline.spec.sections import OnExhausted

DEFAULT_OVERDRAW = 0.05
"""Draw 5% more tokens than a step holds. The scheduler then has a choice of what to place, instead of
having to place everything, and defers the rest; deferred samples come first in the next draw and count
toward their source's share there, so the overdraw never accumulates: the pool of deferred samples stays
about ``overdraw * tokens_per_step`` plus what packing could not place."""


def step_budget(tokens_per_step: int, overdraw: float = DEFAULT_OVERDRAW) -> int:
    """Tokens to draw for a step of ``tokens_per_step`` capacity (ranks * micro-batches * tokens each)."""
    if tokens_per_step <= 0 or not 0 <= overdraw <= 1:
        msg = f"need tokens_per_step > 0 and 0 <= overdraw <= 1, got {tokens_per_step}, {overdraw}"
        raise ValueError(msg)
    return math.ceil(tokens_per_step * (1 + overdraw))


def step_rng(seed: int, step: int) -> np.random.Generator:
    """A random generator that depends only on ``(seed, step)``, for random choices within a step."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, step])))


@dataclass(frozen=True)
class Composition:
    """What ``compose_step`` needs besides a draw's inputs: the step's shape, the cost model, the window."""

    shape: StepShape
    cost_model: CostModel
    window: float
    due: float
    window_bytes: float | None = None


@dataclass(frozen=True)
class Mixer:
    """Draws each step of a job by its schedule (see ``draw_step``)."""

    schedule: Schedule
    budget_tokens: int
    on_exhausted: OnExhausted = OnExhausted.STOP
    long_context: LongContext | None = None
    changes: tuple[MixtureChange, ...] = ()
    composition: Composition | None = None

    @classmethod
    def from_spec(cls, spec: JobSpec, overdraw: float = DEFAULT_OVERDRAW) -> Mixer:
        long = None
        if spec.long_context is not None:
            lc = spec.long_context
            long = LongContext(lc.min_length, lc.token_share, frozenset(spec.long_sources()))
        composition = None
        if spec.composition is not None:
            composition = Composition(
                StepShape.from_spec(spec.step),
                spec.cost.cost_model(),
                spec.composition.window_steps,
                spec.composition.due_share,
                spec.composition.window_bytes,
            )
        return cls(
            Schedule.from_spec(spec.mixture, spec.source_names),
            step_budget(spec.step.tokens_per_step, overdraw),
            spec.on_exhausted,
            long,
            composition=composition,
        )

    def with_changes(self, changes: Sequence[MixtureChange]) -> Mixer:
        """This mixer with the accepted mixture ``changes`` overriding its schedule from their steps on."""
        return replace(self, changes=tuple(changes))

    def weights_at(self, step: int) -> dict[str, float]:
        if not self.changes:
            return self.schedule.weights_at(step)
        return MixtureTimeline(self.schedule, self.changes).weights_at(step)

    def initial_state(self) -> MixerState:
        return MixerState.initial(self.schedule.sources)

    def draw(
        self,
        state: MixerState,
        available: Mapping[str, ArrayLike],
        deferred: Mapping[str, ArrayLike] | None = None,
        exhausted: Collection[str] = (),
        media: StepMedia | None = None,
        sizes: Mapping[str, ArrayLike] | None = None,
    ) -> Draw:
        """Draw step ``state.step`` with the schedule's weights at that step: composed from look-ahead
        windows (``compose_step``, which scores its options with the samples' ``media`` where given, and
        bounds its windows by the samples' ``sizes`` in bytes where the composition has ``window_bytes``) or,
        without composition, from each source's FIFO head (``draw_step``)."""
        args = (state, self.weights_at(state.step), self.budget_tokens, available, deferred)
        if (c := self.composition) is not None:
            return compose_step(
                *args,
                exhausted=exhausted,
                on_exhausted=self.on_exhausted,
                shape=c.shape,
                cost_model=c.cost_model,
                window=c.window,
                due=c.due,
                media=media,
                window_bytes=c.window_bytes,
                sizes=sizes,
            )
        return draw_step(*args, exhausted=exhausted, on_exhausted=self.on_exhausted, long_context=self.long_context)
