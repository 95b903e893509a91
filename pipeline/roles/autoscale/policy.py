"""The autoscaling policy: how many loaders each source should run. Pure: no Kafka, no clock.

Per source, from what was measured (``SourceReading``):

- **demand** (tokens/s) = the constructor's consumption rate x the source's share. The share is the
  largest the schedule gives the source from the current step to the step the constructor reaches after
  the look-ahead horizon (``demand.py``), so a source whose share grows gets loaders before it is needed.
  While the constructor waits for one source (``blocking``: it holds less than the draw needs), it would
  consume more of it than is made: its demand is taken to be at least its supply, and the headroom asks for
  one more loader per decision until the backlog builds up (before the first step, too).
- **supply** = loaders x the measured per-loader rate.
- **needed** = the fewest loaders whose supply covers demand x headroom, within the source's min/max, and
  never more than the work units still to take (a loader with no unit adds nothing).
- **hysteresis on the backlog** (tokens made but not consumed yet, in seconds of demand): scale up only
  while the backlog is below the low watermark; scale down only once it has stayed above the high
  watermark for ``scale_down_after_s``. Between the two the count holds, so noisy rates do not flap it.
- **budget**: when the sources want more loaders than ``max_total_loaders``, each gets its min and the
  rest go one at a time to the source whose supply covers its demand worst.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from pipeline.spec.autoscaling import AutoscalingSpec


@dataclass(frozen=True)
class PolicySettings:
    headroom: float = 1.2
    low_watermark_s: float = 10.0
    high_watermark_s: float = 60.0
    scale_down_after_s: float = 30.0
    max_total_loaders: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.headroom) and self.headroom >= 1):
            msg = f"headroom must be finite and >= 1, got {self.headroom!r}"
            raise ValueError(msg)
        if not 0 <= self.low_watermark_s < self.high_watermark_s or self.scale_down_after_s < 0:
            msg = (
                f"need 0 <= low_watermark_s < high_watermark_s and scale_down_after_s >= 0, got "
                f"{self.low_watermark_s}, {self.high_watermark_s}, {self.scale_down_after_s}"
            )
            raise ValueError(msg)
        if self.max_total_loaders is not None and self.max_total_loaders < 1:
            msg = f"max_total_loaders must be >= 1, got {self.max_total_loaders}"
            raise ValueError(msg)

    @classmethod
    def from_spec(cls, spec: AutoscalingSpec, max_total_loaders: int | None = None) -> PolicySettings:
        """The spec's settings; ``max_total_loaders`` (a command line's cap) replaces the spec's when given."""
        return cls(
            headroom=spec.headroom,
            low_watermark_s=spec.low_watermark_s,
            high_watermark_s=spec.high_watermark_s,
            scale_down_after_s=spec.scale_down_after_s,
            max_total_loaders=max_total_loaders or spec.max_total_loaders,
        )


@dataclass(frozen=True)
class SourceReading:
    """What was measured of one source. ``demand`` is None until the constructor's rate is known,
    ``per_loader_rate`` until the loaders' is; ``units_left`` (work units not yet taken) None if unknown."""

    source: str
    loaders: int
    min_loaders: int
    max_loaders: int
    demand: float | None
    per_loader_rate: float | None
    backlog_tokens: float
    units_left: int | None = None
    blocking: bool = False  # the constructor cannot draw a step for want of this source's samples


@dataclass(frozen=True)
class Decision:
    source: str
    loaders: int
    desired: int
    demand: float
    supply: float
    backlog_s: float
    reason: str

    def line(self) -> str:
        """One log line: the count, the numbers behind it and the reason."""
        return (
            f"{self.source}: {self.loaders} -> {self.desired} loaders (demand {self.demand:.0f} tokens/s, "
            f"supply {self.supply:.0f} tokens/s, backlog {self.backlog_s:.1f} s): {self.reason}"
        )


@dataclass(frozen=True)
class PolicyState:
    """What the policy remembers between decisions: since when each source's backlog is above the high
    watermark."""

    high_since: Mapping[str, float] = field(default_factory=dict)


def decide(
    readings: Sequence[SourceReading], settings: PolicySettings, state: PolicyState, now: float
) -> tuple[list[Decision], PolicyState]:
    """The desired loaders of every source at time ``now`` (seconds, any clock), and the next state."""
    high_since = dict(state.high_since)
    decisions = []
    for reading in readings:
        decision, above_since = _decide_source(reading, settings, high_since.get(reading.source), now)
        if above_since is None:
            high_since.pop(reading.source, None)
        else:
            high_since[reading.source] = above_since
        decisions.append(decision)
    if settings.max_total_loaders is not None:
        decisions = _within_budget(decisions, readings, settings)
    return decisions, PolicyState(high_since)


def _decide_source(
    r: SourceReading, settings: PolicySettings, above_since: float | None, now: float
) -> tuple[Decision, float | None]:
    rate = r.per_loader_rate if r.per_loader_rate and r.per_loader_rate > 0 else None
    supply = r.loaders * rate if rate else 0.0
    demand = r.demand
    if r.blocking and rate is not None:
        demand = max(demand or 0.0, supply)  # the constructor waits for it: it would take more than it gets
    backlog_s = _backlog_seconds(r.backlog_tokens, demand)
    high = demand is not None and backlog_s > settings.high_watermark_s
    above_since = (now if above_since is None else above_since) if high else None
    if rate is None or demand is None:
        desired, reason = _before_rates_are_measured(r, demand, rate)
    else:
        desired, reason, above_since = _by_demand(r, settings, demand, rate, backlog_s, above_since, now)
    desired = min(max(desired, r.min_loaders), r.max_loaders)
    return Decision(r.source, r.loaders, desired, demand or 0.0, supply, backlog_s, reason), above_since


def _backlog_seconds(backlog_tokens: float, demand: float | None) -> float:
    """The backlog in seconds of demand: infinite while demand is unknown, or zero while nothing is made
    and nothing demanded."""
    if demand is None:
        return math.inf
    if demand > 0:
        return backlog_tokens / demand
    return math.inf if backlog_tokens > 0 else 0.0


def _before_rates_are_measured(r: SourceReading, demand: float | None, rate: float | None) -> tuple[int, str]:
    """The count while the constructor's consumption or the loaders' rate is unknown: held, except for a
    source the constructor waits for."""
    if rate is None and r.blocking:
        # Warm-up: the constructor starves on this source before its loaders' rate can be measured. One more
        # loader per decision, within bounds, budget and the units left; once measured, _by_demand decides.
        if r.units_left is not None and r.units_left <= r.loaders:
            return r.loaders, "holding: the constructor waits for it, but no unit is left to share"
        return r.loaders + 1, "scaling up: the constructor waits for it; its rate is not measured yet"
    if demand is None:
        return r.loaders, "holding: the constructor's consumption is not measured yet"
    return r.loaders, "holding: the loaders' rate is not measured yet"


def _by_demand(
    r: SourceReading,
    settings: PolicySettings,
    demand: float,
    rate: float,
    backlog_s: float,
    above_since: float | None,
    now: float,
) -> tuple[int, str, float | None]:
    """The count that covers ``demand`` x headroom at ``rate`` per loader, moved only as the backlog's
    hysteresis allows; and since when the backlog is above the high watermark, after this decision."""
    wanted = demand * settings.headroom / rate  # loaders, fractional
    needed = r.max_loaders if wanted > r.max_loaders else max(math.ceil(wanted - 1e-9), r.min_loaders)
    target = f"demand x {settings.headroom:g} = {demand * settings.headroom:.0f} tokens/s needs {needed}"
    if needed > r.loaders:
        return (*_scale_up(r, settings, needed, target, backlog_s), above_since)
    if needed < r.loaders:
        return _scale_down(r, settings, needed, target, above_since, now)
    return r.loaders, f"covered: {target}", above_since


def _scale_up(
    r: SourceReading, settings: PolicySettings, needed: int, target: str, backlog_s: float
) -> tuple[int, str]:
    """Up to ``needed`` loaders while the backlog is below the low watermark and units are left to take."""
    if r.units_left is not None and r.units_left <= 0:
        return r.loaders, f"holding: {target}, but no work unit is left to take"
    if not backlog_s < settings.low_watermark_s:
        return (
            r.loaders,
            f"holding: {target}, but the backlog is above the low watermark ({settings.low_watermark_s:g} s)",
        )
    more = needed if r.units_left is None else min(needed, r.loaders + r.units_left)
    return more, f"scaling up: {target}; the backlog is below the low watermark"


def _scale_down(
    r: SourceReading, settings: PolicySettings, needed: int, target: str, above_since: float | None, now: float
) -> tuple[int, str, float | None]:
    """Down to ``needed`` loaders once the backlog has stayed above the high watermark for
    ``scale_down_after_s``; the next scale-down then needs it to stay high again."""
    if above_since is not None and now - above_since >= settings.scale_down_after_s:
        why = f"scaling down: {target}; the backlog stayed above the high watermark for {now - above_since:.0f} s"
        return needed, why, None
    why = f"holding: {target}, but the backlog has not stayed above the high watermark for "
    return r.loaders, why + f"{settings.scale_down_after_s:g} s", above_since


def _within_budget(
    decisions: list[Decision], readings: Sequence[SourceReading], settings: PolicySettings
) -> list[Decision]:
    """Cut the desired counts to ``max_total_loaders``: every source its min, then one loader at a time to
    the source wanting more whose supply covers its demand worst (ties: the earlier source)."""
    budget = settings.max_total_loaders
    assert budget is not None
    if sum(d.desired for d in decisions) <= budget:
        return decisions
    rates = {r.source: r.per_loader_rate or 0.0 for r in readings}
    given = {d.source: min(r.min_loaders, d.desired) for d, r in zip(decisions, readings, strict=True)}
    left = budget - sum(given.values())

    def coverage(d: Decision) -> float:
        if d.demand <= 0:
            return math.inf
        if rates[d.source] <= 0:
            return given[d.source] / d.desired  # no rate yet: by the share of what it asked for
        return given[d.source] * rates[d.source] / (d.demand * settings.headroom)

    while left > 0:
        wanting = [d for d in decisions if given[d.source] < d.desired]
        if not wanting:
            break
        worst = min(wanting, key=coverage)
        given[worst.source] += 1
        left -= 1
    out = []
    for d in decisions:
        if given[d.source] < d.desired:
            why = f"{d.reason}; the budget of {budget} loaders gives it {given[d.source]} (worst covered first)"
            d = replace(d, desired=given[d.source], reason=why)
        out.append(d)
    return out
