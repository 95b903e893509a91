"""Find a step in a rank topic without reading the topic: a binary search over offsets.

A rank topic holds one record per step, in step order, then perhaps the end-of-data record; aborted
transactions and transaction markers take offsets too. "The first committed record at or after offset
``o``" therefore holds a step that never decreases as ``o`` grows, and a search that probes
``log2(records)`` offsets finds the record of any step. Each probe reads one record's headers.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from topics.errors import DecodeError
from topics.formats.batch_codec import STEP_KEY, end_of_data_steps
from topics.formats.headers import find_header, parse_decimal
from topics.kafka.authorization import raise_if_read_refused
from topics.kafka.librdkafka_log import logged
from topics.kafka.offset_lookup import OffsetLookup

PROBE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class StepRecord:
    """A record of a rank topic: a batch of ``step``, or (``end``) the end-of-data record that follows
    ``step - 1``, the job's last step."""

    offset: int
    step: int
    end: bool = False


@dataclass(frozen=True)
class StepLocation:
    """Where reading for a step starts. ``record`` is the first committed record holding that step or a
    later one, ``None`` when the topic holds none yet. ``offset`` is just past the last committed record
    of an earlier step: reading from there skips nothing committed since, even a step whose transaction
    was still open during the search."""

    offset: int
    record: StepRecord | None


def locate_step(
    config: Mapping[str, Any],
    topic: str,
    step: int,
    *,
    partition: int = 0,
    timeout_s: float = PROBE_TIMEOUT_S,
    stop_at_end: bool = False,
) -> StepLocation:
    """The first committed record of ``topic``'s ``partition`` whose step is ``step`` or later (the
    end-of-data record counts as the step after the last, or with ``stop_at_end`` as later than any: a
    constructor lane's partition ends with it however far the other lanes went); see ``StepLocation``."""
    consumer = Consumer(
        {
            **logged(config),
            "group.id": f"mixflow-step-index-{uuid.uuid4().hex[:12]}",  # never joined or committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
        }
    )
    ends = OffsetLookup(config, isolation="read_committed")
    try:
        probe = _Probe(consumer, ends, topic, partition, time.monotonic() + timeout_s, config)
        low, high = probe.watermarks()
        # Every committed record below low holds an earlier step; the first at or after high (None past
        # the end) holds step or a later one.
        found: StepRecord | None = None
        while low < high:
            mid = (low + high) // 2
            record = probe.first_at(mid)
            if record is None or record.step >= step or (stop_at_end and record.end):
                high, found = mid, record
            else:
                low = record.offset + 1
        return StepLocation(low, found)
    finally:
        ends.close()
        consumer.close()


class _Probe:
    def __init__(
        self,
        consumer: Consumer,
        ends: OffsetLookup,
        topic: str,
        partition: int,
        deadline: float,
        config: Mapping[str, Any],
    ) -> None:
        self.config = config
        self.consumer = consumer
        self.ends = ends
        self.topic = topic
        self.partition = partition
        self.deadline = deadline

    def watermarks(self) -> tuple[int, int]:
        where = TopicPartition(self.topic, self.partition)
        return self.ends.watermarks(where, timeout_s=max(0.1, self.deadline - time.monotonic()))

    def first_at(self, offset: int) -> StepRecord | None:
        """The first committed record at or after ``offset``, or None when the log ends before one."""
        self.consumer.assign([TopicPartition(self.topic, self.partition, offset)])
        while time.monotonic() < self.deadline:
            message = self.consumer.poll(0.1)
            if message is None:
                continue
            error = message.error()
            if error is None:
                return step_record(message)
            if error.code() == KafkaError._PARTITION_EOF:
                return None
            if error.fatal() or not error.retriable():
                raise_if_read_refused(self.config, error, self.topic)
                raise KafkaException(error)
        msg = f"looking for a step in {self.topic}[{self.partition}]: no answer from the broker at offset {offset}"
        raise TimeoutError(msg)


def step_record(message: Message) -> StepRecord:
    """What a rank topic's record holds, from its headers; ``DecodeError`` for any other record."""
    offset = cast(int, message.offset())  # a record's offset is set
    try:
        steps = end_of_data_steps(message.headers())
        if steps is not None:
            return StepRecord(offset, steps, end=True)
        return StepRecord(offset, parse_decimal(f"header {STEP_KEY}", find_header(message.headers(), STEP_KEY)))
    except ValueError as exc:
        raise DecodeError.of_record(f"not a batch or an end-of-data record: {exc}", message) from exc
