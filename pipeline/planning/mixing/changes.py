"""Mixture changes made while a job runs (``mixflow control set-mixture``): from step ``from_step`` on,
the sources' shares are ``shares`` instead of what the spec's schedule says. Pure: no Kafka.

A change is accepted only if it reaches the constructor before it writes step ``from_step``; the
accepted ones are kept in every later state record, so a restart or a replay applies each at the same
step, whatever the timing of the run that accepted it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, Field, NonNegativeInt

from pipeline.planning.mixing.schedule import Schedule
from topics.formats.json_record import json_record, record_dict


def _some_share(shares: Mapping[str, float]) -> Mapping[str, float]:
    if sum(shares.values()) <= 0:
        msg = "must give some source a share above 0"
        raise ValueError(msg)
    return shares


Share = Annotated[float, Field(ge=0, allow_inf_nan=False)]


@json_record("mixture change")
@dataclass(frozen=True)
class MixtureChange:
    """Shares from ``from_step`` on; a source not named has share 0. ``id`` names the change in acks.

    Its JSON form (``topics.formats.json_record``): ``{"id": "...", "from_step": 12, "shares": {"code": 0.5, ...}}``,
    in the state record and, led by its kind, on the control topic (``pipeline.kafka.control``)."""

    id: str
    from_step: NonNegativeInt
    shares: Annotated[Mapping[str, Share], AfterValidator(_some_share)]

    def __post_init__(self) -> None:
        if self.from_step < 0:
            msg = f"mixture change {self.id}: from_step must be >= 0, got {self.from_step}"
            raise ValueError(msg)
        bad = {s: x for s, x in self.shares.items() if not (math.isfinite(x) and x >= 0)}
        if bad or sum(self.shares.values()) <= 0:
            msg = f"mixture change {self.id}: shares must be finite, >= 0 and sum to over 0, got {dict(self.shares)}"
            raise ValueError(msg)

    def to_dict(self) -> dict[str, object]:
        return record_dict(self)


def refusal(change: MixtureChange, next_step: int, sources: Sequence[str]) -> str | None:
    """Why ``change`` cannot apply to a job whose next step to write is ``next_step`` and which mixes
    ``sources``; None when it can."""
    if change.from_step < next_step:
        return f"step {change.from_step} was written already (the next step is {next_step})"
    unknown = sorted(set(change.shares) - set(sources))
    if unknown:
        return f"the job mixes no source {', '.join(unknown)} (it mixes {', '.join(sources)})"
    return None


class MixtureTimeline:
    """The spec's schedule, overridden from each accepted change's ``from_step`` on by its shares (the
    latest change in force wins). Shares of sources the job no longer mixes are ignored; a change that
    leaves no share to the sources mixed now is ignored too."""

    def __init__(self, base: Schedule, changes: Sequence[MixtureChange]) -> None:
        self.base = base
        self.sources = base.sources
        # Sorted by step; of two changes from the same step, the one accepted later holds.
        self.changes = sorted(changes, key=lambda c: c.from_step)

    def weights_at(self, step: int) -> dict[str, float]:
        for change in reversed(self.changes):
            if change.from_step > step:
                continue
            row = {s: float(change.shares.get(s, 0.0)) for s in self.sources}
            total = sum(row.values())
            if total > 0:
                return {s: x / total for s, x in row.items()}
        return self.base.weights_at(step)
