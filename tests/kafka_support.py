"""Helpers for tests against the real broker: create a topic, read a topic to its end."""

from __future__ import annotations

import time
import uuid
from typing import Literal

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

Isolation = Literal["read_committed", "read_uncommitted"]


def create_topic(bootstrap: str, name: str, partitions: int = 1, timeout_s: float = 30.0) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future it answers
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1)], operation_timeout=timeout_s
    )
    futures[name].result(timeout=timeout_s)


def read_to_end(
    bootstrap: str,
    topic: str,
    *,
    isolation: Isolation = "read_committed",
    timeout_s: float = 60.0,
) -> list[Message]:
    """Every record of every partition of ``topic`` that is visible under ``isolation``, in
    partition then offset order. Fails with a message when the end is not reached in time."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s)
        partitions = sorted(metadata.topics[topic].partitions)
        # The end for read_committed is the last stable offset, which the high watermark reaches once
        # no transaction is open; tests read after their producers have finished.
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: list[Message] = []
        deadline = time.monotonic() + timeout_s
        while True:
            positions = {tp.partition: tp.offset for tp in consumer.position([TopicPartition(topic, p) for p in partitions])}
            if all(positions[p] >= ends[p] for p in partitions):
                break
            if time.monotonic() > deadline:
                msg = f"reading {topic} to its end {ends} took over {timeout_s} s; positions {positions}"
                raise TimeoutError(msg)
            for message in consumer.consume(num_messages=1000, timeout=0.5):
                if message.error():
                    raise KafkaException(message.error())
                records.append(message)
        records.sort(key=lambda m: (m.partition(), m.offset()))
        return records
    finally:
        consumer.close()
