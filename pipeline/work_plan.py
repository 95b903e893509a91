"""Publish a source's work units to its work topic exactly once, and find out when all are done.

The units and a ``work-plan`` record on the job's control topic are written in one transaction by a
producer whose ``transactional.id`` belongs to the source. Initialising it fences any other planner of
the same source, so of two loaders that start together either the later one sees the earlier one's plan
or the earlier one's transaction is aborted: planning twice never duplicates units.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from confluent_kafka import Consumer, TopicPartition
from pydantic import ConfigDict, TypeAdapter, ValidationError

from connectors.work_units import WorkUnit
from pipeline.kafka_clients import KafkaConfig, commit_or_abort, produce, transactional_producer
from topics.errors import DecodeError, MixflowError
from topics.log_reader import read_to_end
from topics.names import JobTopics
from topics.retry import KAFKA_RETRY
from topics.validation import describe_errors

log = logging.getLogger(__name__)

PLAN_KIND = "work-plan"


@dataclass(frozen=True)
class WorkPlan:
    """``ends`` maps each work-topic partition to the offset after its last unit.

    The JSON form is ``{"kind": "work-plan", "source": ..., "units": ..., "ends": {"<partition>": <end>}}``.
    :meth:`from_json` validates it against these fields with pydantic in lax mode, as the ``int()`` it
    replaces (``"3"`` and ``3.0`` are 3, partition keys are strings); ``kind`` and other fields are ignored.
    """

    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="ignore")

    source: str
    units: int
    ends: dict[int, int]

    def to_json(self) -> bytes:
        ends = {str(p): e for p, e in sorted(self.ends.items())}
        return json.dumps({"kind": PLAN_KIND, "source": self.source, "units": self.units, "ends": ends}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> WorkPlan:
        try:
            raw = json.loads(data)
        except (ValueError, TypeError, RecursionError) as exc:  # TypeError: a value that is not bytes (None)
            msg = f"work-plan record is malformed: {exc}"
            raise DecodeError(msg) from exc
        try:
            return _PLAN.validate_python(raw)
        except ValidationError as exc:
            msg = f"work-plan record is malformed: {describe_errors(exc, cls)}"
            raise DecodeError(msg) from exc


_PLAN = TypeAdapter(WorkPlan)


def plan_key(source: str) -> bytes:
    return f"{PLAN_KIND}/{source}".encode()


def read_work_plan(config: KafkaConfig, topics: JobTopics, source: str) -> WorkPlan | None:
    """The committed work plan of ``source``, or None when it has not been planned yet."""
    key = plan_key(source)
    for message in read_to_end(config, topics.control):
        if message.key() == key:
            try:
                return WorkPlan.from_json(message.value())
            except DecodeError as exc:
                raise exc.at(message.topic(), message.partition(), message.offset()) from exc
    return None


def publish_work_plan(
    config: KafkaConfig, topics: JobTopics, source: str, units: Sequence[WorkUnit], partitions: int
) -> WorkPlan:
    """Publish ``units`` round-robin over the work topic's partitions unless the source was planned
    already; return the plan that holds."""
    producer = transactional_producer(config, f"{topics.job}.planner.{source}")
    if (existing := read_work_plan(config, topics, source)) is not None:
        log.info("source %s was planned already: %d units", source, existing.units)
        return existing
    work_topic = topics.work(source)
    ends: dict[int, int] = {}
    failures: list[str] = []

    def delivered(err, message) -> None:
        if err is not None:
            failures.append(str(err))
            return
        ends[message.partition()] = max(ends.get(message.partition(), 0), message.offset() + 1)

    producer.begin_transaction()
    for index, unit in enumerate(units):
        produce(
            producer,
            work_topic,
            unit.to_json(),
            key=unit.unit_id.encode(),
            partition=index % partitions,
            on_delivery=delivered,
        )
    if producer.flush(60) or failures:
        producer.abort_transaction(60)
        msg = f"publishing the work units of {source} to {work_topic} failed: {failures[:3] or 'timed out'}"
        raise MixflowError(msg)
    plan = WorkPlan(source, len(units), ends)
    produce(producer, topics.control, plan.to_json(), key=plan_key(source))
    if not commit_or_abort(producer):
        msg = f"the work plan of {source} was aborted (another planner took over); start again"
        raise MixflowError(msg)
    log.info("published %d work units of %s to %s", len(units), source, work_topic)
    return plan


def plan_is_done(consumer: Consumer, work_topic: str, plan: WorkPlan, timeout_s: float = 10.0) -> bool:
    """True when the group of ``consumer`` has committed every unit of the plan."""
    wanted = [TopicPartition(work_topic, p) for p in sorted(plan.ends)]
    committed = KAFKA_RETRY.call(
        lambda: consumer.committed(wanted, timeout=timeout_s), f"reading the committed offsets of {work_topic}"
    )
    return all(tp.offset >= plan.ends[tp.partition] for tp in committed)
