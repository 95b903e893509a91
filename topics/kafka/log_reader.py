"""Read a topic from the beginning to its current end: for control records, tests and audits."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from topics.kafka.authorization import is_authorization_error, raise_if_read_refused, refused
from topics.kafka.librdkafka_log import logged
from topics.kafka.retry import KAFKA_RETRY, kafka_transient

Isolation = Literal["read_committed", "read_uncommitted"]
# Answers for a topic created a moment ago, before its partition leaders are known everywhere.
_SETTLING_ERRORS = frozenset(
    {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART}
)


def read_to_end(
    config: Mapping[str, Any],
    topic: str,
    *,
    isolation: Isolation = "read_committed",
    timeout_s: float = 60.0,
    tail: int | None = None,
) -> list[Message]:
    """Every record of every partition of ``topic`` visible under ``isolation``, in partition then
    offset order, up to the end each partition had when the call began. With ``tail``, only what lies
    in the last ``tail`` offsets of each partition (transaction markers take offsets too).

    Under read_committed a partition's end is its last stable offset: the reading waits while a
    transaction is open there and raises ``TimeoutError`` naming the positions if the end is not
    reached in time."""
    consumer = Consumer(
        {
            **logged(config),
            "group.id": f"mixflow-reader-{uuid.uuid4().hex[:12]}",  # never committed, so never reused
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        deadline = time.monotonic() + timeout_s
        partitions = _partitions(consumer, topic, deadline, config)
        try:
            ends = {p: _end_offset(consumer, TopicPartition(topic, p), deadline) for p in partitions}
        except KafkaException as exc:
            if exc.args and is_authorization_error(exc.args[0]):
                raise refused(config, "READ", "topic", topic, "reading its end") from exc
            raise
        start = {p: max(0, ends[p] - tail) if tail is not None else 0 for p in partitions}
        consumer.assign([TopicPartition(topic, p, start[p]) for p in partitions if ends[p] > start[p]])
        records: list[Message] = []
        while True:
            positions = {
                tp.partition: tp.offset for tp in consumer.position([TopicPartition(topic, p) for p in partitions])
            }
            if all(ends[p] == start[p] or positions[p] >= ends[p] for p in partitions):
                break
            if time.monotonic() > deadline:
                msg = f"reading {topic} to its end {ends} took over {timeout_s} s; positions {positions}"
                raise TimeoutError(msg)
            for message in _arrived(consumer):
                if error := message.error():
                    raise_if_read_refused(config, error, message.topic() or topic)
                    raise KafkaException(error)
                # A record (not an error) has its partition and offset.
                if cast(int, message.offset()) < ends[cast(int, message.partition())]:
                    records.append(message)
        records.sort(key=lambda m: (m.partition(), m.offset()))
        return records
    finally:
        consumer.close()


def _arrived(consumer: Consumer) -> list[Message]:
    """What the client holds: waits up to 0.2 s for the first record, then takes the rest without waiting
    (a ``consume`` call with a timeout waits all of it out unless its batch fills)."""
    first = consumer.poll(0.2)
    return [] if first is None else [first, *consumer.consume(num_messages=10_000, timeout=0)]


def _end_offset(consumer: Consumer, partition: TopicPartition, deadline: float) -> int:
    """The high watermark, waiting out the moments after a topic's creation when its leader is unknown."""
    policy = replace(
        KAFKA_RETRY,
        transient=kafka_transient(also=_SETTLING_ERRORS),
        deadline_s=max(0.1, deadline - time.monotonic()),
        backoff_s=0.05,
    )
    attempts = [0]

    def high_watermark() -> int:
        left = max(0.1, deadline - time.monotonic())
        if attempts[0]:
            # After a broker restart the client can hold metadata without the partition ("Local: Unknown
            # partition") and keep it: ask for the topic again before the next try.
            consumer.list_topics(partition.topic, timeout=min(left, 5.0))
        attempts[0] += 1
        return consumer.get_watermark_offsets(partition, timeout=left)[1]

    return policy.call(high_watermark, f"reading the end of {partition.topic}[{partition.partition}]")


def _partitions(consumer: Consumer, topic: str, deadline: float, config: Mapping[str, Any]) -> list[int]:
    while True:
        metadata = consumer.list_topics(topic, timeout=max(0.1, deadline - time.monotonic()))
        described = metadata.topics.get(topic)
        if described is not None and described.error is None and described.partitions:
            return sorted(described.partitions)
        error = described.error if described is not None else None
        if is_authorization_error(error):
            raise refused(config, "DESCRIBE", "topic", topic, "asking for its metadata")
        settling = error is None or error.retriable() or error.code() in _SETTLING_ERRORS
        if not settling or time.monotonic() > deadline:
            msg = f"topic {topic} cannot be read: {error or 'not found'}"
            raise KafkaException(msg)
        time.sleep(0.05)  # a topic created a moment ago: wait for its metadata to settle
