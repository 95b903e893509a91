"""A job's history as its topics hold it, for ``mixflow report``: every step's numbers, when each step was
committed, the schedule at each step, and each source's backlog over time.

The times are record timestamps: a step's is its state record's (written in the step's transaction), a
source's count of records at a time comes from the broker's index of record timestamps
(``offsets_for_times``), so no source record is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.kafka.state_topic import StateRecord, first_per_step, read_state_records
from pipeline.planning.mixing import Schedule
from pipeline.planning.mixing.changes import MixtureTimeline
from pipeline.roles.constructor import ConstructorState
from pipeline.spec import JobSpec
from pipeline.tools.observe.cp_steps import CPWeighing
from pipeline.tools.observe.naive import REPORT_BACKLOG_STEPS, NaiveLoading, NaiveStream
from pipeline.tools.observe.offsets import OffsetProbe
from pipeline.tools.observe.rank_topics import read_steps
from pipeline.tools.observe.step_stats import StepStats, step_stats
from pipeline.tools.observe.vision_parts import EncoderWeighing
from topics.errors import MixflowError
from topics.formats.names import JobTopics
from topics.kafka.clients import KafkaConfig

# Backlog points looked up by time (one broker round trip per point); more steps are sub-sampled.
MAX_BACKLOG_POINTS = 200


@dataclass(frozen=True)
class JobTimeline:
    """What ``mixflow report`` plots and sums up of a job, step by step and over time."""

    job: str
    sources: list[str]
    stats: list[StepStats]  # (K,) every step written, in step order
    step_times: np.ndarray  # (K,) when each step was committed, seconds since the epoch
    weights: np.ndarray  # (K, S) the schedule's shares at each step, accepted mixture changes included
    steps_with_all_sources: int  # steps written before the first source ran out
    backlog_times: np.ndarray  # (T,) seconds since the epoch
    backlog: np.ndarray  # (T, S) source offsets written but not yet delivered into a step, at each time
    encoder: EncoderWeighing | None = None  # a multimodal job's weighing of the vision encoder
    cp: CPWeighing | None = None  # a context-parallel job's shape and cost
    naive_tail: list[NaiveLoading] = field(default_factory=list)  # naive loading's steps after the job's last
    naive_dropped: int = 0  # samples past naive loading's backlog (``REPORT_BACKLOG_STEPS``), not in its time

    @property
    def tokens_per_step(self) -> np.ndarray:
        """(K, S)"""
        if not self.stats:
            return np.zeros((0, len(self.sources)), dtype=np.int64)
        return np.stack([s.tokens_by_source for s in self.stats])


def schedule_weights(spec: JobSpec, state: ConstructorState | None, steps: int) -> np.ndarray:
    """(steps, S) the shares the job mixed by at each step: the spec's schedule, overridden by the mixture
    changes accepted in ``state`` (the last state record)."""
    schedule = Schedule.from_spec(spec.mixture, spec.source_names)
    if state is None or not state.changes:
        return schedule.weights_array(np.arange(steps))
    timeline = MixtureTimeline(schedule, state.changes)
    return np.array([[timeline.weights_at(k)[s] for s in spec.source_names] for k in range(steps)]).reshape(
        steps, len(spec.source_names)
    )


def read_timeline(config: KafkaConfig, spec: JobSpec, job: str | None = None) -> JobTimeline:
    """The timeline of ``job`` (the spec's by default)."""
    job = job or spec.job
    sources = spec.source_names
    cost, encoder, cp = spec.cost.cost_model(), EncoderWeighing.for_spec(spec), CPWeighing.for_spec(spec)
    naive = NaiveStream(cost, REPORT_BACKLOG_STEPS)  # the job's samples in written order, as one run
    steps = read_steps(config, job, spec.step.ranks)
    stats = [step_stats(batches, sources, cost, encoder, cp, naive) for batches in steps]
    states = {r.step: r for r in first_per_step(read_state_records(config, JobTopics(job)))}
    written = [states[s.step] for s in stats if s.step in states]
    if len(written) != len(stats):
        missing = sorted({s.step for s in stats} - states.keys())[:5]
        msg = f"{JobTopics(job).state} holds no state record of steps {missing} written to the rank topics"
        raise MixflowError(msg)
    first_out = next((r.step for r in written if r.state.exhausted), len(written))
    times, backlog = _backlog(config, job, sources, written, spec.constructor.lanes)
    return JobTimeline(
        job=job,
        sources=sources,
        stats=stats,
        step_times=np.array([r.time_s for r in written]),
        weights=schedule_weights(spec, written[-1].state if written else None, len(stats)),
        steps_with_all_sources=first_out,
        backlog_times=times,
        backlog=backlog,
        encoder=encoder,
        cp=cp,
        naive_tail=naive.drain(),
        naive_dropped=naive.dropped,
    )


def _backlog(
    config: KafkaConfig, job: str, sources: list[str], written: list[StateRecord], lanes: int
) -> tuple[np.ndarray, np.ndarray]:
    """At up to ``MAX_BACKLOG_POINTS`` state records: the time, and per source the records written to its
    topic by then (all partitions) less those the latest state record of every lane says are delivered
    (transaction markers count as records). Lane ``j`` writes the steps ``k`` with ``k mod lanes == j``."""
    topics = JobTopics(job)
    every = max(1, -(-len(written) // MAX_BACKLOG_POINTS))
    latest: dict[int, StateRecord] = {}  # per lane, its last record so far
    chosen: list[tuple[float, dict[str, int]]] = []
    for i, record in enumerate(written):
        latest[record.step % lanes] = record
        if i % every == 0:
            delivered = {s: sum(r.delivered.get(s, 0) for r in latest.values()) for s in sources}
            chosen.append((record.time_s, delivered))
    backlog = np.zeros((len(chosen), len(sources)))
    with OffsetProbe(config) as probe:
        for i, (time_s, delivered) in enumerate(chosen):
            produced = probe.at_time([topics.src(s) for s in sources], int(time_s * 1000))
            backlog[i] = [max(0, produced[topics.src(s)] - delivered[s]) for s in sources]
    return np.array([time_s for time_s, _ in chosen]), backlog
