"""Loader autoscaling in a job spec: a source's bounds (``sources[i].autoscale``) and the job's policy
settings (``autoscaling``). Off unless ``autoscaling.enabled``: a job then runs the ``loaders`` each source
names, as it always did."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipeline.spec._problems import Problems


class SourceAutoscaleSpec(BaseModel):
    """How many loaders the autoscaler may give one source."""

    model_config = ConfigDict(extra="forbid")

    min: int = Field(1, ge=1, description="Fewest loaders of the source.")
    max: int = Field(8, ge=1, description="Most loaders of the source (a source's work topic has 8 partitions).")

    @model_validator(mode="after")
    def _check(self) -> SourceAutoscaleSpec:
        problems = Problems("SourceAutoscaleSpec")
        if self.max < self.min:
            problems.add(("max",), f"must be at least min ({self.min})", self.max)
        problems.raise_if_any()
        return self


class AutoscalingSpec(BaseModel):
    """The autoscaler's policy (``pipeline/roles/autoscale/policy.py``). A source without an ``autoscale``
    section keeps its ``loaders``."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="Start and stop loaders with demand; off: every source runs `loaders`.")
    headroom: float = Field(
        1.2, ge=1, le=10, allow_inf_nan=False, description="Supply to keep per unit of demand (1.2: 20% spare)."
    )
    interval_s: float = Field(5.0, gt=0, allow_inf_nan=False, description="Seconds between two decisions.")
    lookahead_s: float = Field(
        30.0,
        ge=0,
        allow_inf_nan=False,
        description="Horizon: a source's demand uses its largest share from now to the step the constructor "
        "reaches this many seconds ahead, so a growing source gets loaders before it is needed.",
    )
    low_watermark_s: float = Field(
        10.0, ge=0, allow_inf_nan=False, description="Scale up only when the backlog holds less demand than this."
    )
    high_watermark_s: float = Field(
        60.0, gt=0, allow_inf_nan=False, description="Scale down only when the backlog holds more demand than this..."
    )
    scale_down_after_s: float = Field(
        30.0, ge=0, allow_inf_nan=False, description="...and has held more for this long."
    )
    smoothing: float = Field(
        0.3,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="Weight of the newest measured rate in its moving average (1: no smoothing).",
    )
    max_total_loaders: int | None = Field(
        None, ge=1, description="Budget of loaders of all sources together; the worst covered source gets them first."
    )

    @model_validator(mode="after")
    def _check(self) -> AutoscalingSpec:
        problems = Problems("AutoscalingSpec")
        if self.high_watermark_s <= self.low_watermark_s:
            problems.add(
                ("high_watermark_s",), f"must be above low_watermark_s ({self.low_watermark_s})", self.high_watermark_s
            )
        problems.raise_if_any()
        return self
