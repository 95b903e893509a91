"""Which steps of a finished job the constructor had to wait for a source: a count, read after the fact
from what the job wrote, so runs can be compared without timing anything.

Step ``k`` is drawn once the state record of step ``k - 1`` is written. It needs, of each source in play,
the samples up to the one that completes its window (``composition.window_steps`` steps of the source's
share; one step's share when the job draws in order), counted from the positions in that state record.
If that sample was produced after the state record, the constructor waited for it: a stall, on that source.

A sample is visible only once its unit's transaction commits, so its time here is the latest produce
timestamp of the samples of its file (a unit is a file, or part of one: ``file_times``). The commit itself
comes a little later still, so a wait shorter than a commit is missed: the count is a lower bound, the same
for every run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.planning.mixing import Mixer
from pipeline.planning.mixing.compose import HEADROOM
from pipeline.planning.step.state import ConstructorState
from pipeline.spec import JobSpec
from topics.formats.names import JobTopics
from topics.formats.sample_codec import decode_sample_message
from topics.kafka.clients import KafkaConfig
from topics.kafka.log_reader import read_to_end


@dataclass(frozen=True)
class SourceLog:
    """A source topic as read: offsets (ascending), token lengths and produce timestamps (ms), each (n,)."""

    offsets: np.ndarray
    lengths: np.ndarray
    timestamps: np.ndarray


@dataclass(frozen=True)
class StallCount:
    steps: int  # steps judged (every one after the first)
    stalled: int
    by_source: dict[str, int]

    @property
    def fraction(self) -> float:
        return self.stalled / self.steps if self.steps else 0.0


def count_stalls(
    states: list[tuple[int, ConstructorState]],
    sources: Mapping[str, SourceLog],
    need: Callable[[int], Mapping[str, float]],
) -> StallCount:
    """Stalls over ``states`` (``(timestamp ms, state)`` in order, one per step); ``need(step)`` gives the
    tokens of each source the draw of ``step`` must have. A need no sample ever met (the source ran out)
    is not a stall: more loaders could not have helped."""
    stalled = 0
    by_source = dict.fromkeys(sources, 0)
    judged = 0
    for written_ms, state in states[:-1] if states and states[-1][1].finished else states:
        judged += 1
        waited = False
        for source, tokens in need(state.step).items():
            log = sources.get(source)
            position = state.positions.get(source)
            if tokens <= 0 or log is None or position is None:
                continue
            start = int(np.searchsorted(log.offsets, position.low))
            fresh = ~np.isin(log.offsets[start:], np.asarray(position.used, dtype=np.int64))  # (m,)
            cumulative = np.cumsum(np.where(fresh, log.lengths[start:], 0))  # (m,)
            last = int(np.searchsorted(cumulative, tokens))
            if last < cumulative.size and log.timestamps[start + last] > written_ms:
                by_source[source] += 1
                waited = True
        stalled += waited
    return StallCount(judged, stalled, by_source)


def file_times(sample_ids: list[str], timestamps: np.ndarray) -> np.ndarray:
    """Each sample's time as the latest timestamp of the samples of the same file (and epoch): a unit's
    samples commit together, after its last one is produced. Ids are ``<source>/<file>/<row>[#k][@e<n>]``."""
    files = []
    for sample_id in sample_ids:
        file, _, row = sample_id.rpartition("/")
        files.append(f"{file}@{row.partition('@')[2]}")
    latest: dict[str, int] = {}
    for name, ms in zip(files, timestamps.tolist(), strict=True):
        latest[name] = max(latest.get(name, ms), ms)
    return np.array([latest[name] for name in files], dtype=np.int64)


def window_tokens(spec: JobSpec) -> float:
    """Tokens a draw waits for across all sources, each source's part being its share: the composition
    window (``window_steps`` steps' goal), or one step's budget when the job draws in order."""
    budget = Mixer.from_spec(spec).budget_tokens
    if spec.composition is None:
        return float(budget)
    return min(budget, spec.step.tokens_per_step * (1 - HEADROOM)) * spec.composition.window_steps


def step_needs(spec: JobSpec) -> Callable[[int], dict[str, float]]:
    """Tokens of each source the draw of a step waits for, by the spec's mixture and composition."""
    mixer = Mixer.from_spec(spec)
    goal = window_tokens(spec)

    def need(step: int) -> dict[str, float]:
        return {s: share * goal for s, share in mixer.weights_at(step).items()}

    return need


def job_stalls(config: KafkaConfig, spec: JobSpec, since_ms: Sequence[float] = ()) -> list[StallCount]:
    """The stalls of the job ``spec`` names, read from its topics (a single-lane job): over all its steps,
    then over the steps drawn after each time of ``since_ms`` (epoch milliseconds), one count each."""
    topics = JobTopics(spec.job)
    states = [
        (record.timestamp()[1], ConstructorState.from_bytes(record.value()))
        for record in read_to_end(config, topics.state)
    ]
    logs = {}
    for source in spec.source_names:
        samples = [
            (r.offset(), decode_sample_message(r), r.timestamp()[1]) for r in read_to_end(config, topics.src(source))
        ]
        produced = np.array([ms for _, _, ms in samples], dtype=np.int64)
        logs[source] = SourceLog(
            np.array([offset for offset, _, _ in samples], dtype=np.int64),
            np.array([sample.length for _, sample, _ in samples], dtype=np.int64),
            file_times([sample.sample_id for _, sample, _ in samples], produced),
        )
    need = step_needs(spec)
    # A step is drawn once the previous step's state record is written: judge those written after the time.
    return [
        count_stalls(states, logs, need),
        *(count_stalls([x for x in states if x[0] >= t], logs, need) for t in since_ms),
    ]
