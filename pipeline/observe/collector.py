"""``mixflow top``'s Kafka side: collects the ``JobFacts`` of a job from its topics, its loader groups and
its sinks' metrics endpoints. Everything it shows is computed in ``frame.py``."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import numpy as np
from confluent_kafka import KafkaException, Message
from confluent_kafka.admin import AdminClient

from pipeline.constructor import ConstructorState
from pipeline.constructor.state_topic import STATE_TAIL
from pipeline.kafka_clients import KafkaConfig
from pipeline.mixing import Schedule
from pipeline.mixing.changes import MixtureTimeline
from pipeline.observe.endpoints import run_endpoints, scrape_sink_steps
from pipeline.observe.follow import TopicFollower
from pipeline.observe.frame import JobFacts, SourceFacts
from pipeline.observe.offsets import OffsetProbe
from pipeline.observe.tally import StepTally
from pipeline.spec import JobSpec
from topics.batch_codec import decode_batch_message, end_of_data_steps
from topics.dead_letter import decode_dead_letter_message
from topics.errors import DecodeError
from topics.names import JobTopics
from topics.sample_codec import decode_sample_message

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
            spec.source_names, spec.step.ranks, spec.cost.cost_model(), self._weights_at, recent_steps
        )
        self.dead_letters: Counter[tuple[str, str]] = Counter()
        rank_topics = [self.topics.rank(r) for r in range(spec.step.ranks)]
        self.ranks = TopicFollower(config, rank_topics, self._on_batch)
        self.dlq = TopicFollower(config, [self.topics.dlq], self._on_dead_letter)

    def _weights_at(self, step: int) -> np.ndarray:
        shares = self.timeline.weights_at(step)
        return np.array([shares[s] for s in self.spec.source_names])

    def _on_batch(self, message: Message) -> None:
        if end_of_data_steps(message.headers()) is None:
            self.tally.add(decode_batch_message(message))

    def _on_dead_letter(self, message: Message) -> None:
        letter = decode_dead_letter_message(message)
        self.dead_letters[(letter.source, letter.reason)] += 1

    def collect(self, budget_s: float = 5.0) -> JobFacts:
        """The facts now; the rank and dead-letter topics are read for at most ``budget_s`` each."""
        now_ms = int(time.time() * 1000)
        since_ms = now_ms - int(self.window_s * 1000)
        state, recent_state_steps = self._state(since_ms)
        if state is not None:
            self.timeline = MixtureTimeline(self.schedule, state.changes)
        self.ranks.catch_up(budget_s)
        self.dlq.catch_up(budget_s)
        sources = [self._source(i, s, state, since_ms) for i, s in enumerate(self.spec.source_names)]
        next_step = state.step if state is not None else 0
        endpoints = run_endpoints(self.run_folder) if self.run_folder is not None else []
        return JobFacts(
            job=self.job,
            window_s=self.window_s,
            sources=sources,
            schedule_now=self.timeline.weights_at(next_step),
            next_step=next_step,
            recent_state_steps=recent_state_steps,
            finished=state is not None and state.finished,
            recent=sorted(self.tally.recent, key=lambda s: s.step),
            sink_steps=scrape_sink_steps(endpoints),
            dead_letters=dict(self.dead_letters),
        )

    def _state(self, since_ms: int) -> tuple[ConstructorState | None, int]:
        """The last committed state, and how many steps were committed since ``since_ms``."""
        topic = self.topics.state
        end = self.probe.end(topic)
        if not end:
            return None, 0
        first = self.probe.at_time([topic], since_ms)[topic]
        records = self.probe.tail(topic, max(STATE_TAIL, end - first))
        if not records:
            return None, 0
        last = records[-1]
        try:
            state = ConstructorState.from_bytes(last.value())
        except DecodeError as exc:
            raise exc.at(last.topic(), last.partition(), last.offset()) from exc
        recent = {r.key() for r in records if r.timestamp()[1] >= since_ms}
        return state, len(recent)

    def _source(self, i: int, source: str, state: ConstructorState | None, since_ms: int) -> SourceFacts:
        topic = self.topics.src(source)
        end = self.probe.end(topic)
        recent = 0
        mean_tokens = None
        if end:
            recent = end - self.probe.at_time([topic], since_ms)[topic]
            latest = self.probe.tail(topic, LENGTH_SAMPLE)
            if latest:
                mean_tokens = float(np.mean([decode_sample_message(m).tokens.size for m in latest]))
                end = latest[-1].offset() + 1  # past the last committed sample, not its commit marker
        delivered = None
        if state is not None and (position := state.positions.get(source)) is not None:
            delivered = position.low + len(position.used)
        return SourceFacts(
            name=source,
            end_offset=end,
            recent_records=recent,
            mean_sample_tokens=mean_tokens,
            delivered_offsets=delivered,
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
