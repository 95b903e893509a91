"""The mixture: each source's share of a step's tokens, fixed or following a curriculum over steps."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipeline.spec._problems import Loc, Problems

Share = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Weights = dict[str, Share]


class Interpolation(StrEnum):
    """How weights between two schedule points are found."""

    CONSTANT = "constant"
    """Hold each point's weights until the next point."""
    LINEAR = "linear"
    """Move each source's (normalised) share linearly from one point to the next."""


class MixturePoint(BaseModel):
    """The weights from ``step`` on."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(ge=0)
    weights: Weights = Field(description="Share per source; normalised, so only ratios matter.")


class MixtureSpec(BaseModel):
    """Either fixed ``weights`` or a curriculum ``schedule``; not both.

    Shares are relative: each point's shares are divided by their sum. A source left out of a point
    has share 0 there. After the last point of a schedule its weights hold for the rest of training.
    """

    model_config = ConfigDict(extra="forbid")

    weights: Weights | None = Field(None, description="Fixed share per source.")
    schedule: list[MixturePoint] | None = Field(
        None, min_length=1, description="Curriculum: points with strictly increasing steps, the first at 0."
    )
    interpolation: Interpolation | None = Field(
        None,
        description="Between schedule points: "
        + ", ".join(m.value for m in Interpolation)
        + f"; default {Interpolation.CONSTANT.value}. Only with schedule.",
    )

    @model_validator(mode="after")
    def _check(self) -> MixtureSpec:
        problems = Problems("MixtureSpec")
        if (self.weights is None) == (self.schedule is None):
            got = "both" if self.weights is not None else "neither"
            problems.add((), f"give exactly one of 'weights' (fixed) or 'schedule' (curriculum), not {got}", got)
        if self.schedule is None and self.interpolation is not None:
            problems.add(("interpolation",), "interpolation applies only to a schedule", self.interpolation.value)
        for loc, weights in self.located_weights():
            if sum(weights.values()) <= 0:
                problems.add(loc, "the shares must sum to more than 0", weights)
        if self.schedule:
            if self.schedule[0].step != 0:
                problems.add(
                    ("schedule", 0, "step"), "the first schedule point must be at step 0", self.schedule[0].step
                )
            for i in range(1, len(self.schedule)):
                if self.schedule[i].step <= self.schedule[i - 1].step:
                    problems.add(
                        ("schedule", i, "step"),
                        f"steps must strictly increase; the point before is at step {self.schedule[i - 1].step}",
                        self.schedule[i].step,
                    )
        problems.raise_if_any()
        if self.schedule is not None and self.interpolation is None:
            self.interpolation = Interpolation.CONSTANT
        return self

    def located_weights(self) -> list[tuple[Loc, Weights]]:
        """Each weights mapping with its location in the spec (relative to ``mixture``)."""
        if self.weights is not None:
            return [(("weights",), self.weights)]
        return [(("schedule", i, "weights"), p.weights) for i, p in enumerate(self.schedule or [])]

    def points(self) -> list[tuple[int, dict[str, float]]]:
        """``(step, normalised weights)`` per point; fixed weights are one point at step 0."""
        out = []
        for i, (_, weights) in enumerate(self.located_weights()):
            total = sum(weights.values())
            step = self.schedule[i].step if self.schedule else 0
            out.append((step, {name: share / total for name, share in weights.items()}))
        return out

    @property
    def is_curriculum(self) -> bool:
        return self.schedule is not None and len(self.schedule) > 1
