"""Resuming a job under a changed spec, at a step boundary. Pure: no Kafka.

Sources added to the spec start at the beginning of their topic with no credit. Sources removed from it
leave the mix but keep their position in every later state record (``dormant``): their samples that
were read but not delivered (deferred ones included) stay above the low watermark, so a source added
back later resumes exactly where it stopped, and no sample is lost or delivered twice. Weights and the
curriculum come from the spec as it is now; the mixer's credits carry over for the sources that stay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

from pipeline.planning.mixing import MixerState
from pipeline.planning.shape import StepShape
from pipeline.planning.step.state import ConstructorState, SourcePosition
from topics.errors import MixflowError


@dataclass(frozen=True)
class CarriedState:
    """The state to resume from (its sources are the spec's), and the positions of the sources the spec
    no longer mixes."""

    state: ConstructorState
    dormant: dict[str, SourcePosition] = field(default_factory=dict)
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


def carry_over(state: ConstructorState, sources: Sequence[str]) -> CarriedState:
    """``state`` (the last committed one) for a spec that mixes ``sources``."""
    if list(state.positions) == list(sources):
        return CarriedState(state)
    known = dict(state.positions)
    added = tuple(s for s in sources if s not in known)
    removed = tuple(s for s in known if s not in sources)
    mixer = MixerState(state.mixer.step, {s: state.mixer.credit.get(s, 0.0) for s in sources}, state.mixer.long_credit)
    carried = replace(
        state,
        mixer=mixer,
        positions={s: known.get(s, SourcePosition()) for s in sources},
        deferred=tuple(ref for ref in state.deferred if ref.source in sources),
        exhausted=tuple(s for s in state.exhausted if s in sources),
    )
    return CarriedState(carried, {s: known[s] for s in removed}, added, removed)


def check_step_shape(written: StepShape | None, spec: StepShape, job: str) -> None:
    """Refuse to resume ``job`` under a step shape other than the one its steps were written with (the part
    that a running job keeps, ``StepShape.written``)."""
    if written is None:
        return
    ours, theirs = spec.written(), written.written()
    changed = [
        f"step.{name} is {getattr(ours, name) or 'unset'} in the spec but {getattr(theirs, name) or 'unset'} in "
        "the steps written"
        for name in (f.name for f in fields(StepShape))
        if getattr(ours, name) != getattr(theirs, name)
    ]
    if not changed:
        return
    msg = (
        f"job {job} cannot resume under this spec: " + "; ".join(changed) + ". A running job keeps its step "
        "shape (its trainers read these rank topics); write the steps into another job instead "
        "(mixflow construct --output-job NAME)"
    )
    raise MixflowError(msg)
