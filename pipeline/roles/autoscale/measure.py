"""What the autoscaler reads of a running job, from its topics: the constructor's latest state records
(step and consumed offsets per source), each source topic's end offsets and tokens per offset, and the work
units each source's loaders have not taken yet. A thin Kafka shell; the arithmetic is in ``autoscaler.py``."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from pipeline.kafka.state_topic import decode_state, last_records
from pipeline.kafka.work_plan import WorkPlan, read_work_plan
from pipeline.planning.step.state import ConstructorState
from topics.errors import DecodeError
from topics.formats.names import JobTopics
from topics.formats.sample_codec import decode_sample_message
from topics.kafka.clients import KafkaConfig
from topics.kafka.log_reader import read_to_end
from topics.kafka.offset_lookup import OffsetLookup

# Records at the end of each source topic read for its tokens per offset.
LENGTH_TAIL = 64
WATERMARK_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class SourceSnapshot:
    end_offset: int  # the source topic's end, summed over its partitions (transaction markers included)
    consumed: int  # offsets the constructor has delivered (its low watermark plus the used ones above it)
    tokens_per_offset: float | None  # from the topic's last records; None while it is empty
    units_left: int | None  # work units no loader of the source has committed yet; None before the plan

    @property
    def backlog_offsets(self) -> int:
        return max(self.end_offset - self.consumed, 0)


@dataclass(frozen=True)
class JobSnapshot:
    step: int | None  # the next step the constructor builds; None before its first step
    changes: tuple  # the mixture changes in the state record (``MixtureChange``)
    sources: dict[str, SourceSnapshot]


class JobProbe:
    """Reads ``JobSnapshot``s of one job. ``close()`` when done."""

    def __init__(self, config: KafkaConfig, job: str, sources: list[str]) -> None:
        self.config = config
        self.topics = JobTopics(job)
        self.sources = list(sources)
        self._plans: dict[str, WorkPlan] = {}
        # Reads watermarks and committed offsets only: it never subscribes, so it never joins a group.
        self._ends = OffsetLookup(config)
        self._groups: dict[str, OffsetLookup] = {}

    def snapshot(self) -> JobSnapshot:
        states = self._last_states()
        step = max((s.step for s in states), default=None)
        changes = max((s.changes for s in states), key=len, default=())
        sources = {}
        for source in self.sources:
            used = [s.positions[source] for s in states if source in s.positions]
            sources[source] = SourceSnapshot(
                end_offset=self._end_offset(self.topics.src(source)),
                consumed=sum(p.low + len(p.used) for p in used),
                tokens_per_offset=self._tokens_per_offset(self.topics.src(source)),
                units_left=self._units_left(source),
            )
        return JobSnapshot(step, changes, sources)

    def _last_states(self) -> list[ConstructorState]:
        """The last committed state of every constructor lane (one partition of the state topic each)."""
        states = []
        for record in last_records(self.config, self.topics).values():
            with contextlib.suppress(DecodeError):  # a broken record: the constructor reports it on restart
                states.append(decode_state(record))
        return states

    def _end_offset(self, topic: str) -> int:
        total = 0
        for p in self._ends.partitions(topic, WATERMARK_TIMEOUT_S):
            with contextlib.suppress(KafkaException):  # leader not known yet: the partition counts as empty
                total += self._ends.end(TopicPartition(topic, p), WATERMARK_TIMEOUT_S)
        return total

    def _tokens_per_offset(self, topic: str) -> float | None:
        # Uncommitted records say as much about lengths, and reading them does not wait for open transactions.
        records = read_to_end(self.config, topic, isolation="read_uncommitted", tail=LENGTH_TAIL, timeout_s=10.0)
        if not records:
            return None
        tokens = 0
        for record in records:
            with contextlib.suppress(DecodeError):
                tokens += decode_sample_message(record).length
        spans: dict[int, tuple[int, int]] = {}
        for r in records:
            first, last = spans.get(r.partition(), (r.offset(), r.offset()))
            spans[r.partition()] = (min(first, r.offset()), max(last, r.offset()))
        offsets = sum(last - first + 1 for first, last in spans.values())
        return tokens / offsets

    def _units_left(self, source: str) -> int | None:
        plan = self._plans.get(source)
        if plan is None:
            plan = read_work_plan(self.config, self.topics, source)
            if plan is None:
                return None
            self._plans[source] = plan
        group = self._groups.get(source)
        if group is None:  # the loaders' committed offsets, asked without joining their group
            group = self._groups[source] = OffsetLookup(self.config, group=f"{self.topics.job}.loaders.{source}")
        work = self.topics.work(source)
        committed = group.committed([TopicPartition(work, p) for p in sorted(plan.ends)], WATERMARK_TIMEOUT_S)
        left = sum(max(plan.ends[tp.partition] - max(tp.offset, 0), 0) for tp in committed)
        if left == 0:
            self._plans.pop(source)  # read the plan again next time: it may have grown (splits, epochs)
        return left

    def loaders(self) -> dict[str, int]:
        """Loaders per source as the brokers see them: the members of each source's loader group (how
        ``mixflow autoscale`` counts them where another system, e.g. Kubernetes, runs the loaders)."""
        admin = AdminClient(dict(self.config))
        groups = {s: f"{self.topics.job}.loaders.{s}" for s in self.sources}
        futures = admin.describe_consumer_groups(list(groups.values()), request_timeout=WATERMARK_TIMEOUT_S)
        return {s: len(futures[g].result(timeout=WATERMARK_TIMEOUT_S).members) for s, g in groups.items()}

    def close(self) -> None:
        self._ends.close()
        for group in self._groups.values():
            group.close()
