"""A loader's transactions: a unit taken from the work group and, while the transaction is younger than
``unit_seconds``, the units already fetched after it, in one transaction. Each unit is all in or all out,
and small units (a short text file) do not pay a commit each. A unit estimated over the source's
``unit_target_s`` is split instead of loaded (``unit_sizing.py``). On abort every partition is rewound to
its first unit of the transaction. An object changed since planning, under ``storage.on_changed_object:
stop``, aborts the transaction and stops the loader (``ChangedObjectStopError``)."""

from __future__ import annotations

import time
from collections import deque
from typing import NamedTuple

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from connectors import WorkUnit
from connectors.storage import ObjectRefusedError
from pipeline.kafka.role_protocol import TransactionalRole
from pipeline.roles.loader.metrics import LoaderMetrics
from pipeline.roles.loader.options import LoaderOptions
from pipeline.roles.loader.read_ahead import ReadAhead
from pipeline.roles.loader.stats import LoaderStats, UnitCounts
from pipeline.roles.loader.unit_loading import UnitLoader, decode_unit, where
from pipeline.roles.loader.work_group import WorkGroup
from pipeline.roles.loader.work_planning import SourcePlanning
from topics.errors import RefusedError
from topics.formats.dead_letter import DeadLetter


class ChangedObjectStopError(RefusedError):
    """A unit's object changed or vanished since planning and the source's spec says to stop: the loader
    exits (code 5, which ``mixflow run`` does not restart) with nothing of the unit published."""

    def __init__(self, job: str, source: str, unit: WorkUnit, reason: ObjectRefusedError) -> None:
        super().__init__(
            f"source {source}: unit {unit.unit_id}: {reason}; storage.on_changed_object is stop, so nothing of"
            " this unit was published and the loader stops: restore the object as it was planned, or plan the"
            f" source again (`mixflow topics delete --job {job}` and a new run, or a new job name)"
        )


class PublishedUnit(NamedTuple):
    """A work record produced in the open transaction: its unit (None for an undecodable record, which
    became a dead letter) and what it produced."""

    message: Message
    unit: WorkUnit | None
    counts: UnitCounts


class UnitTransactions:
    """Publishes the units ``group`` takes, in transactions of ``role``."""

    def __init__(
        self,
        role: TransactionalRole,
        group: WorkGroup,
        loader: UnitLoader,
        planning: SourcePlanning,
        stats: LoaderStats,
        metrics: LoaderMetrics,
        options: LoaderOptions,
    ) -> None:
        self.role = role
        self.group = group
        self.loader = loader
        self.planning = planning
        self.stats = stats
        self.metrics = metrics
        self.options = options
        self.read_ahead = ReadAhead(loader.runtime.reader)

    def publish(self, producer: Producer, first: Message) -> None:
        """Publish ``first`` and the units ready after it in one transaction, and count them once it
        commits; rewind to redo them when it aborts."""
        began = time.monotonic()
        done: list[PublishedUnit] = []
        taken: list[Message] = []
        try:
            committed = self.role.transaction(
                producer,
                self.group.consumer,
                lambda: self._publish_units(producer, first, done, taken, began),
                f"units from {where(first)}",
            )
        finally:
            self.stats.busy_seconds += time.monotonic() - began
            self.read_ahead.forget()
        self.metrics.transaction_ended(committed, time.monotonic() - began)
        if not committed:
            self.group.rewind(taken or [first])
            self.stats.aborted += 1
            return
        self.planning.committed()
        for published in done:
            self.stats.unit_committed(published.unit, published.counts)
            self.metrics.unit_committed(published.counts.samples, published.counts.tokens)

    def _publish_units(
        self, producer: Producer, first: Message, done: list[PublishedUnit], taken: list[Message], began: float
    ) -> list[TopicPartition]:
        """Produce ``first`` and the units ready after it (appended to ``done``; every record taken from the
        group, in order, to ``taken``); their offsets to commit. From an object store the next units are read
        while one is tokenized (``ReadAhead``), so a transaction takes up to that many units more than its
        ``unit_seconds`` would."""
        self.group.revoked = False
        sizer = self.planning.sizer
        if sizer is not None:
            sizer.begin()
        pending: deque[tuple[Message, WorkUnit | None, list[DeadLetter]]] = deque()

        def take(message: Message) -> None:
            taken.append(message)
            unit, letters = decode_unit(message, self.loader.source)
            pending.append((message, unit, letters))
            if unit is not None:
                self.read_ahead.start(unit)

        take(first)
        while pending:
            while len(pending) <= self.read_ahead.units and (ready := self._next_ready(began, len(taken))) is not None:
                take(ready)
            done.append(self._publish_record(producer, *pending.popleft()))
            if not pending and (ready := self._next_ready(began, len(taken))) is not None:
                take(ready)
        if sizer is not None:
            sizer.produce(producer, self.planning.topics, self.planning.plan, self.planning.work_partitions)
        if self.group.revoked:
            # Another loader may already be redoing these units from the committed offsets.
            msg = "partitions were revoked during the transaction"
            raise KafkaException(KafkaError(KafkaError._STATE, msg, txn_requires_abort=True))
        ends: dict[tuple[str, int], int] = {}
        for published in done:
            m = published.message
            ends[(m.topic(), m.partition())] = m.offset() + 1
        return [TopicPartition(topic, partition, end) for (topic, partition), end in ends.items()]

    def _publish_record(
        self, producer: Producer, message: Message, unit: WorkUnit | None, letters: list[DeadLetter]
    ) -> PublishedUnit:
        """The unit a work record holds, published; an undecodable record as a dead letter."""
        if unit is None:
            return PublishedUnit(message, None, self.loader.publish_letters(producer, letters))
        try:
            counts = self._publish_unit(producer, unit, message.partition() + message.offset())
        except ObjectRefusedError as exc:
            raise ChangedObjectStopError(self.planning.topics.job, self.loader.source, unit, exc) from exc
        return PublishedUnit(message, unit, counts)

    def _publish_unit(self, producer: Producer, unit: WorkUnit, place: int) -> UnitCounts:
        """Load ``unit``, or with a unit target, split it when it would take too long (the finer units are
        produced with the transaction's other records by ``UnitSizer.produce``), timing what is loaded."""
        sizer = self.planning.sizer
        if sizer is None:
            return self.loader.load(producer, unit, place, self.read_ahead.items(unit))
        if (children := sizer.split(unit)) is not None:
            sizer.add_split(children)
            return UnitCounts()
        began = time.perf_counter()
        counts = self.loader.load(producer, unit, place, self.read_ahead.items(unit))
        sizer.add_measurement(unit, time.perf_counter() - began)
        return counts

    def _next_ready(self, began: float, units: int) -> Message | None:
        """The next unit if it is already fetched and the transaction may take one more; else None."""
        if self.role.stopping or self.group.revoked or time.monotonic() - began >= self.options.unit_seconds:
            return None
        if self.options.max_units is not None and self.stats.units + units >= self.options.max_units:
            return None
        return self.group.ready()
