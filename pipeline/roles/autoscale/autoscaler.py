"""The autoscaler: job snapshots in, one decision per source out, every interval.

It turns snapshots into the policy's readings: the constructor's step rate (smoothed), each source's demand
looked ahead on the mixture (``demand.py``), backlog in tokens beyond what the constructor must hold to draw
a step at all (its share of the composition window: a source it waits for never has less), and the
per-loader rate = the source topic's
production rate / its loaders, smoothed, measured only over intervals in which the loaders were not held back
by anything else: the count was steady long enough for a new loader to have started, and every loader had
a work unit to take. ``observe`` is pure (tests feed it snapshots); ``tick`` reads one from a ``JobProbe``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.planning.mixing import Mixer
from pipeline.roles.autoscale.demand import source_demands
from pipeline.roles.autoscale.measure import JobProbe, JobSnapshot
from pipeline.roles.autoscale.policy import Decision, PolicySettings, PolicyState, SourceReading, decide
from pipeline.roles.autoscale.rates import SmoothedRate
from pipeline.roles.autoscale.stalls import window_tokens
from pipeline.spec import JobSpec

# Seconds a newly started loader takes to import, plan-wait and open its clients: an interval that began
# sooner after a change of the count does not measure the per-loader rate.
LOADER_START_S = 4.0


@dataclass
class _SourceTrack:
    production: SmoothedRate  # offsets/s per loader
    tokens_per_offset: float | None = None
    loaders: int | None = None
    changed_at: float = float("-inf")
    last_time: float | None = None
    had_work: bool = False


class Autoscaler:
    """Decides each source's loaders for one job; keep one per job and call ``tick`` every interval."""

    def __init__(self, spec: JobSpec, settings: PolicySettings | None = None) -> None:
        self.spec = spec
        self.scaling = spec.autoscaling
        self.settings = settings or PolicySettings.from_spec(spec.autoscaling)
        self.mixer = Mixer.from_spec(spec)
        self.steps = SmoothedRate(self.scaling.smoothing)
        self.state = PolicyState()
        self.tracks = {s: _SourceTrack(SmoothedRate(self.scaling.smoothing)) for s in spec.source_names}
        self.window_tokens = window_tokens(spec)
        self.last_step: int | None = None  # the constructor's step at the last reading

    def tick(self, probe: JobProbe, loaders: Mapping[str, int], now: float) -> list[Decision]:
        """Read the job and decide (``Decision.line()`` says why, for the caller to log)."""
        return self.observe(probe.snapshot(), loaders, now)

    def observe(self, snapshot: JobSnapshot, loaders: Mapping[str, int], now: float) -> list[Decision]:
        """The decisions for ``snapshot``, read at ``now`` (seconds) while ``loaders`` ran per source."""
        steps_per_second = None
        if snapshot.step is not None:
            steps_per_second = self.steps.update(now, snapshot.step)
        demands: dict[str, float] | None = None
        mixer = self.mixer.with_changes(snapshot.changes)
        held = {s: share * self.window_tokens for s, share in mixer.weights_at(snapshot.step or 0).items()}
        if snapshot.step is not None and steps_per_second is not None:
            tokens_per_step = self.spec.step.tokens_per_step
            demands = source_demands(mixer, snapshot.step, steps_per_second, tokens_per_step, self.scaling.lookahead_s)
        stuck = snapshot.step is None or snapshot.step == self.last_step
        self.last_step = snapshot.step
        readings = []
        for source in self.spec.source_names:
            spec = self.spec.source(source)
            lo, hi = spec.loader_bounds()
            count = loaders.get(source, 0)
            seen = snapshot.sources[source]
            per_loader = self._per_loader_offsets(self.tracks[source], count, seen.end_offset, seen.units_left, now)
            track = self.tracks[source]
            if seen.tokens_per_offset is not None:
                track.tokens_per_offset = seen.tokens_per_offset
            tokens = track.tokens_per_offset or 0.0
            readings.append(
                SourceReading(
                    source=source,
                    loaders=count,
                    min_loaders=lo,
                    max_loaders=hi,
                    demand=None if demands is None else demands.get(source, 0.0),
                    per_loader_rate=per_loader * tokens if per_loader is not None and tokens else None,
                    backlog_tokens=max(seen.backlog_offsets * tokens - held.get(source, 0.0), 0.0),
                    units_left=seen.units_left,
                    # Before its rate is measured the policy adds a loader per decision to a blocking source:
                    # only while the constructor is stuck (no step since the last reading), and once the
                    # loaders started so far had time to make something, so that it does not run ahead of them.
                    blocking=self._blocking(source, snapshot, tokens, held.get(source, 0.0))
                    and (per_loader is not None or (stuck and now - track.changed_at >= LOADER_START_S)),
                )
            )
        decisions, self.state = decide(readings, self.settings, self.state, now)
        return decisions

    @staticmethod
    def _blocking(source: str, snapshot: JobSnapshot, tokens_per_offset: float, held: float) -> bool:
        """The constructor cannot draw for want of ``source``: its backlog is under what a draw holds, or,
        before its first sample (no tokens per offset yet), its topic is empty while another's is not."""
        seen = snapshot.sources[source]
        if tokens_per_offset:
            return seen.backlog_offsets * tokens_per_offset < held
        return seen.end_offset == 0 and any(s.end_offset > 0 for s in snapshot.sources.values())

    def _per_loader_offsets(
        self, track: _SourceTrack, loaders: int, end_offset: int, units_left: int | None, now: float
    ) -> float | None:
        if loaders != track.loaders:
            track.loaders, track.changed_at = loaders, now
        settled = track.last_time is not None and track.last_time >= track.changed_at + LOADER_START_S
        has_work = units_left is not None and units_left >= loaders > 0
        measure = settled and track.had_work and has_work
        track.last_time, track.had_work = now, has_work
        return track.production.update(now, end_offset, measure=measure, per=max(loaders, 1))
