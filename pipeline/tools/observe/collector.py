"""``mixflow top``'s Kafka side: collects the ``JobFacts`` of a job from its topics, its loader groups and
its sinks' metrics endpoints. Everything it shows is computed in ``frame.py``."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import numpy as np
from confluent_kafka import KafkaException, Message
from confluent_kafka.admin import AdminClient

from pipeline.kafka.state_topic import STATE_TAIL, decode_state
from pipeline.metrics.endpoints import Endpoint
from pipeline.planning.mixing import Schedule
from pipeline.planning.mixing.changes import MixtureTimeline
from pipeline.spec import JobSpec
from pipeline.tools.observe.cp_steps import CPWeighing
from pipeline.tools.observe.endpoints import run_endpoints, scrape_sink_steps
from pipeline.tools.observe.follow import TopicFollower
from pipeline.tools.observe.frame import JobFacts, SourceFacts
from pipeline.tools.observe.lanes import LaneStates
from pipeline.tools.observe.offsets import OffsetProbe
from pipeline.tools.observe.tally import StepTally
from pipeline.tools.observe.vision_parts import EncoderWeighing
from topics.errors import DecodeError
from topics.formats.batch_codec import decode_any_batch_message, end_of_data_steps
from topics.formats.dead_letter import decode_dead_letter_message
from topics.formats.names import JobTopics
from topics.formats.progress import decode_progress
from topics.formats.sample_codec import decode_sample_message
from topics.kafka.clients import KafkaConfig

# The latest samples of a source whose mean length turns its record rate into a token rate.
LENGTH_SAMPLE = 64
ADMIN_TIMEOUT_S = 5.0


def loader_group(job: str, source: str) -> str:
    """The consumer group of a source's loaders (``SourceLoader``'s group id)."""
    return f"{job}.loaders.{source}"


class JobCollector:
    """Looks at a job again at each ``collect``; the rank and dead-letter topics are read once, as they
    grow. ``run_folder``, when given, holds the ``metrics.json`` of ``mixflow run``."""

    def __init__(
        self,
        config: KafkaConfig,
        spec: JobSpec,
        job: str | None = None,
        run_folder: Path | None = None,
        window_s: float = 10.0,
        recent_steps: int = 20,
    ) -> None:
        self.spec = spec
        self.job = job or spec.job
        self.topics = JobTopics(self.job)
        self.window_s = window_s
        self.run_folder = run_folder
        self.schedule = Schedule.from_spec(spec.mixture, spec.source_names)
        self.timeline = MixtureTimeline(self.schedule, ())
        self.probe = OffsetProbe(config)
        self.admin = AdminClient(dict(config))
        self.tally = StepTally(
            spec.source_names,
            spec.step.ranks,
            spec.cost.cost_model(),
            self._weights_at,
            recent_steps,
            EncoderWeighing.for_spec(spec),
            CPWeighing.for_spec(spec),
        )
        self.dead_letters: Counter[tuple[str, str]] = Counter()
        rank_topics = [self.topics.rank(r) for r in range(spec.step.ranks)]
        self.ranks = TopicFollower(config, rank_topics, self._on_batch)
        self.dlq = TopicFollower(config, [self.topics.dlq], self._on_dead_letter)
        self.reported: dict[int, int] = {}  # per rank, the last step its sink reported on <job>.progress
        self.progress = TopicFollower(config, [self.topics.progress], self._on_progress)

    def _weights_at(self, step: int) -> np.ndarray:
        shares = self.timeline.weights_at(step)
        return np.array([shares[s] for s in self.spec.source_names])

    def _on_batch(self, message: Message) -> None:
        if end_of_data_steps(message.headers()) is None:
            self.tally.add(decode_any_batch_message(message))

    def _on_dead_letter(self, message: Message) -> None:
        letter = decode_dead_letter_message(message)
        self.dead_letters[(letter.source, letter.reason)] += 1

    def _on_progress(self, message: Message) -> None:
        try:
            rank, step = decode_progress(message.value())
        except DecodeError:
            return  # the constructor logs a broken report; the view just leaves it out
        self.reported[rank] = step

    def sink_steps(self, endpoints: list[Endpoint]) -> list[int] | None:
        """The sinks' steps: scraped from their metrics endpoints when any answers, else the steps they
        reported on ``<job>.progress`` (a rank that reported nothing counts as -1); None when neither."""
        scraped = scrape_sink_steps(endpoints)
        if scraped is not None or not self.reported:
            return scraped
        return [self.reported.get(r, -1) for r in range(self.spec.step.ranks)]

    def collect(self, budget_s: float = 5.0) -> JobFacts:
        """The facts now; the rank and dead-letter topics are read for at most ``budget_s`` each."""
        now_ms = int(time.time() * 1000)
        since_ms = now_ms - int(self.window_s * 1000)
        lanes, recent_state_steps = self._lane_states(since_ms)
        if lanes.started:
            self.timeline = MixtureTimeline(self.schedule, lanes.changes)
        self.ranks.catch_up(budget_s)
        self.dlq.catch_up(budget_s)
        self.progress.catch_up(budget_s)
        sources = [self._source(i, s, lanes, since_ms) for i, s in enumerate(self.spec.source_names)]
        endpoints = run_endpoints(self.run_folder) if self.run_folder is not None else []
        return JobFacts(
            job=self.job,
            window_s=self.window_s,
            sources=sources,
            schedule_now=self.timeline.weights_at(lanes.next_step),
            next_step=lanes.next_step,
            recent_state_steps=recent_state_steps,
            finished=lanes.finished,
            recent=sorted(self.tally.recent, key=lambda s: s.step),
            sink_steps=self.sink_steps(endpoints),
            dead_letters=dict(self.dead_letters),
        )

    def _lane_states(self, since_ms: int) -> tuple[LaneStates, int]:
        """The last committed state of every lane, and how many steps (of all lanes) were committed since
        ``since_ms``."""
        topic = self.topics.state
        lanes = self.spec.constructor.lanes
        ends = self.probe.partition_ends(topic)
        if not any(ends.values()):
            return LaneStates(lanes, {}), 0
        firsts = self.probe.partitions_at_time(topic, since_ms)
        window = max(end - firsts.get(p, end) for p, end in ends.items())
        records = self.probe.tail(topic, max(STATE_TAIL, window))
        last = {r.partition(): r for r in records}  # in offset order: the last record of each partition wins
        states = {p: decode_state(record) for p, record in last.items()}
        recent = {r.key() for r in records if r.timestamp()[1] >= since_ms}
        return LaneStates(lanes, states), len(recent)

    def _source(self, i: int, source: str, lanes: LaneStates, since_ms: int) -> SourceFacts:
        topic = self.topics.src(source)
        ends = self.probe.partition_ends(topic)
        recent = 0
        mean_tokens = None
        if any(ends.values()):
            recent = sum(ends.values()) - sum(self.probe.partitions_at_time(topic, since_ms).values())
            latest = self.probe.tail(topic, LENGTH_SAMPLE)
            if latest:
                mean_tokens = float(np.mean([decode_sample_message(m).tokens.size for m in latest]))
                for m in latest:  # past each partition's last committed sample, not its commit marker
                    ends[m.partition()] = m.offset() + 1
        return SourceFacts(
            name=source,
            end_offset=sum(ends.values()) if ends else None,
            recent_records=recent,
            mean_sample_tokens=mean_tokens,
            delivered_offsets=lanes.delivered(source, ends),
            loaders=self._loaders(source),
            samples=int(self.tally.samples[i]),
            tokens=int(self.tally.tokens[i]),
            scheduled_tokens=float(self.tally.scheduled[i]),
        )

    def _loaders(self, source: str) -> int | None:
        group = loader_group(self.job, source)
        try:
            future = self.admin.describe_consumer_groups([group], request_timeout=ADMIN_TIMEOUT_S)[group]
            return len(future.result(timeout=ADMIN_TIMEOUT_S).members)
        except (KafkaException, TimeoutError):
            return None

    def close(self) -> None:
        self.ranks.close()
        self.dlq.close()
        self.probe.close()
