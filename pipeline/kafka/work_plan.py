"""Publish a source's work units to its work topic exactly once, and find out when all are done.

The units and a ``work-plan`` record on the source's plan topic (``<job>.plan.<source>``, which only the
source's loaders write) are written in one transaction by a producer whose ``transactional.id`` belongs to
the source. Initialising it fences any other planner of
the same source, so of two loaders that start together either the later one sees the earlier one's plan
or the earlier one's transaction is aborted: planning twice never duplicates units.

A loader that splits a unit it took (multi-level partitioning) publishes the finer units and a plan
record whose ends cover them, in the transaction that commits the split unit's offset. Loaders split
concurrently, each from the plan it read last, so a source's plan is the merge of all its committed
plan records (each partition's greatest end): every committed unit lies below the merged ends, and the
source is done exactly when its group has committed them (:func:`plan_is_complete`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from pydantic import StrictInt

from connectors.work_units import WorkUnit
from pipeline.kafka.control import UnitCost, plan_records, unit_cost_key
from topics.errors import DecodeError, MixflowError
from topics.formats.json_record import decode, encode, json_field, json_record
from topics.formats.names import JobTopics
from topics.kafka.clients import KafkaConfig, commit_or_abort, produce, transactional_producer
from topics.kafka.log_reader import read_to_end
from topics.kafka.offset_lookup import OffsetLookup
from topics.kafka.retry import KAFKA_RETRY, KafkaUnavailableError

# Delivery errors of a broker that went away for a while: publishing again later may succeed.
_BROKERS_AWAY = frozenset({KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT})

log = logging.getLogger(__name__)
# What can say which offsets a loader group has committed: a member of it, or a lookup that never joins.
GroupOffsets = Consumer | OffsetLookup

PLAN_KIND = "work-plan"


def _sorted_ends(ends: dict[int, int]) -> dict[str, int]:
    return {str(p): e for p, e in sorted(ends.items())}


@json_record("work plan")
@dataclass(frozen=True)
class WorkPlan:
    """``ends`` maps each work-topic partition to the offset after its last unit.

    The JSON form is ``{"kind": "work-plan", "source": ..., "units": ..., "ends": {"<partition>": <end>}}``,
    plus ``"epochs": <n>`` once the plan was extended by epochs planned on demand (``next_epoch``; without
    it, the plan holds the spec's ``epochs``). A source's plan is the merge (:meth:`merged`) of all its
    plan records; ends, unit counts and epochs only grow, so without split units it is the latest record.
    :meth:`from_json` validates it against these fields with pydantic in lax mode, as ``int()`` would
    (``"3"`` and ``3.0`` are 3, partition keys are strings); ``kind`` and other fields are ignored.
    """

    source: str
    units: int
    ends: dict[int, int] = json_field(encode=_sorted_ends)
    epochs: int | None = json_field(omit_default=True, default=None)

    def to_json(self) -> bytes:
        return encode(self, kind=PLAN_KIND, separators=None)

    def epochs_planned(self, spec_epochs: int) -> int:
        return spec_epochs if self.epochs is None else self.epochs

    def merged(self, other: WorkPlan) -> WorkPlan:
        """Both plans' units: each partition's greater end, the greater unit count and epochs."""
        ends = dict(self.ends)
        for partition, end in other.ends.items():
            ends[partition] = max(ends.get(partition, 0), end)
        epochs = [e for e in (self.epochs, other.epochs) if e is not None]
        return replace(self, units=max(self.units, other.units), ends=ends, epochs=max(epochs) if epochs else None)

    @classmethod
    def from_json(cls, data: bytes) -> WorkPlan:
        return decode(cls, data)


def plan_key(source: str) -> bytes:
    return f"{PLAN_KIND}/{source}".encode()


def read_work_plan(config: KafkaConfig, topics: JobTopics, source: str) -> WorkPlan | None:
    """The committed work plan of ``source`` (the merge of its plan records), or None when it is not planned yet."""
    plan = None
    for message in plan_records(config, topics, source, plan_key(source)):
        try:
            record = WorkPlan.from_json(message.value())
        except DecodeError as exc:
            raise exc.at(message.topic(), message.partition(), message.offset()) from exc
        plan = record if plan is None else plan.merged(record)
    return plan


def publish_work_plan(
    config: KafkaConfig,
    topics: JobTopics,
    source: str,
    units: Sequence[WorkUnit],
    partitions: int,
    cost: UnitCost | None = None,
) -> WorkPlan:
    """Publish ``units`` round-robin over the work topic's partitions (and the planner's measured
    ``cost``, if given) unless the source was planned already; return the plan that holds."""
    producer = transactional_producer(config, f"{topics.job}.planner.{source}")
    if (existing := read_work_plan(config, topics, source)) is not None:
        log.info("source %s was planned already: %d units", source, existing.units)
        return existing
    plan = _publish(producer, topics, source, units, partitions, WorkPlan(source, 0, {}), cost)
    log.info("published %d work units of %s to %s", len(units), source, topics.work(source))
    return plan


def extend_work_plan(
    config: KafkaConfig,
    topics: JobTopics,
    source: str,
    spec_epochs: int,
    through_epoch: int,
    plan_epoch: Callable[[int], Sequence[WorkUnit]],
    partitions: int,
) -> WorkPlan:
    """Plan the epochs of ``source`` up to ``through_epoch`` that are not planned yet (``plan_epoch(e)``
    gives epoch ``e``'s units) and publish them with the extended plan, in one transaction of the
    source's planner: of two planners, one publishes and the other finds it done."""
    producer = transactional_producer(config, f"{topics.job}.planner.{source}")
    plan = read_work_plan(config, topics, source)
    if plan is None:
        msg = f"source {source} has no work plan to extend on {topics.plan(source)}"
        raise MixflowError(msg)
    planned = plan.epochs_planned(spec_epochs)
    if through_epoch < planned:
        return plan
    units = [unit for epoch in range(planned, through_epoch + 1) for unit in plan_epoch(epoch)]
    extended = _publish(producer, topics, source, units, partitions, replace(plan, epochs=through_epoch + 1))
    log.info("published epochs %d-%d of %s: %d work units", planned, through_epoch, source, len(units))
    return extended


def _publish(
    producer: Producer,
    topics: JobTopics,
    source: str,
    units: Sequence[WorkUnit],
    partitions: int,
    base: WorkPlan,
    cost: UnitCost | None = None,
) -> WorkPlan:
    """``units`` and the plan ``base`` extended by them, in one transaction."""
    producer.begin_transaction()
    try:
        plan = produce_units(producer, topics, source, units, partitions, base)
    except MixflowError:
        try:
            producer.abort_transaction(60)
        except KafkaException as exc:  # the next planner's producer fences this one and aborts it then
            log.warning("aborting the work plan transaction of %s failed: %s", source, exc)
        raise
    if cost is not None:
        produce(producer, topics.plan(source), cost.to_json(), key=unit_cost_key(source))
    if not commit_or_abort(producer):
        msg = f"the work plan of {source} was aborted (another planner took over); start again"
        raise MixflowError(msg)
    return plan


def produce_units(
    producer: Producer, topics: JobTopics, source: str, units: Sequence[WorkUnit], partitions: int, base: WorkPlan
) -> WorkPlan:
    """Produce ``units`` round-robin over the work topic's partitions, and then the plan record of ``base``
    extended by them, in the producer's open transaction; return that plan. The units are flushed first,
    since the plan's ends are their offsets."""
    work_topic = topics.work(source)
    ends: dict[int, int] = dict(base.ends)
    failures: list[KafkaError] = []

    def delivered(err, message) -> None:
        if err is not None:
            failures.append(err)
            return
        ends[message.partition()] = max(ends.get(message.partition(), 0), message.offset() + 1)

    for index, unit in enumerate(units):
        produce(
            producer,
            work_topic,
            unit.to_json(),
            key=unit.unit_id.encode(),
            partition=(base.units + index) % partitions,
            on_delivery=delivered,
        )
    if producer.flush(60) or failures:
        msg = f"publishing the work units of {source} to {work_topic} failed: {failures[:3] or 'timed out'}"
        if all(error.code() in _BROKERS_AWAY for error in failures):
            raise KafkaUnavailableError(msg)  # the transaction is aborted and the work done again later
        raise MixflowError(msg)
    plan = replace(base, units=base.units + len(units), ends=ends)
    produce(producer, topics.plan(source), plan.to_json(), key=plan_key(source))
    return plan


REQUEST_KIND = "epoch-request"


@json_record("epoch request")
@dataclass(frozen=True)
class EpochRequest:
    """The JSON form is ``{"kind": "epoch-request", "source": ..., "epoch": <n>}``, keyed ``epoch-request/<source>``."""

    source: str
    epoch: StrictInt

    def to_json(self) -> bytes:
        return encode(self, kind=REQUEST_KIND, separators=None)


def request_epoch(config: KafkaConfig, topics: JobTopics, source: str, epoch: int) -> None:
    """Ask the loaders of ``source`` to plan its epochs up to ``epoch`` (the constructor does, under
    ``on_exhausted: next_epoch``). Asking again is harmless: planners skip epochs planned already."""
    producer = Producer({**config, "enable.idempotence": True})
    value = EpochRequest(source, epoch).to_json()
    produce(producer, topics.control, value, key=f"{REQUEST_KIND}/{source}".encode())
    if producer.flush(60):
        msg = f"asking for epoch {epoch} of {source} on {topics.control} timed out"
        raise MixflowError(msg)


def requested_epoch(config: KafkaConfig, topics: JobTopics, source: str) -> int | None:
    """The latest epoch of ``source`` asked for, or None."""
    key = f"{REQUEST_KIND}/{source}".encode()
    wanted = None
    for message in read_to_end(config, topics.control):
        if message.key() == key:
            try:
                epoch = decode(EpochRequest, message.value()).epoch
            except DecodeError as exc:
                where = exc.at(message.topic(), message.partition(), message.offset())
                log.warning("skipping a broken epoch request: %s", where)
                continue
            wanted = epoch if wanted is None else max(wanted, epoch)
    return wanted


def plan_is_done(group: GroupOffsets, work_topic: str, plan: WorkPlan, timeout_s: float = 10.0) -> bool:
    """True when ``group`` (the loaders' group, or a lookup of its offsets) has committed every unit of
    ``plan`` (as read: see :func:`plan_is_complete` for a plan that may have grown by splits since)."""
    wanted = [TopicPartition(work_topic, p) for p in sorted(plan.ends)]
    committed = KAFKA_RETRY.call(
        lambda: group.committed(wanted, timeout_s), f"reading the committed offsets of {work_topic}"
    )
    return all(tp.offset >= plan.ends[tp.partition] for tp in committed)


def plan_is_complete(
    config: KafkaConfig, topics: JobTopics, group: GroupOffsets, plan: WorkPlan
) -> tuple[bool, WorkPlan]:
    """Whether every unit of the source is done, and its plan as last read.

    A split unit's offset is committed together with the plan record that covers its finer units, so
    committed offsets that reach ``plan``'s ends may already hold a split made since ``plan`` was read:
    the plan is read again after the offsets, and the check repeats until the plan read is the one the
    offsets were checked against."""
    work_topic = topics.work(plan.source)
    while plan_is_done(group, work_topic, plan):
        latest = read_work_plan(config, topics, plan.source)
        if latest is None or latest.merged(plan).ends == plan.ends:
            return True, plan
        plan = latest.merged(plan)
    return False, plan
