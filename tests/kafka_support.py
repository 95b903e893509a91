"""Helpers for tests against the real broker."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from topics.kafka.log_reader import read_to_end as _read_to_end


def create_topic(bootstrap: str, name: str, partitions: int = 1, timeout_s: float = 30.0) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future it answers
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1)], operation_timeout=timeout_s
    )
    futures[name].result(timeout=timeout_s)


def read_to_end(bootstrap: str, topic: str, **kwargs):
    return _read_to_end({"bootstrap.servers": bootstrap}, topic, **kwargs)


def committed_values(bootstrap: str, topic: str, at_least: int, timeout_s: float = 30.0) -> list[bytes]:
    """The values ``read_to_end`` reads under read_committed, read again until there are ``at_least`` or
    ``timeout_s`` has passed: the broker writes a transaction's commit markers after ``commit_transaction``
    returns, and until then the last stable offset, where such a reader ends, lies before its records."""
    deadline = time.monotonic() + timeout_s
    values = [m.value() for m in read_to_end(bootstrap, topic)]
    while len(values) < at_least and time.monotonic() < deadline:
        values = [m.value() for m in read_to_end(bootstrap, topic)]
    return values


class TopicGrowth:
    """Counts the records in some single-partition topics so far, committed or not (their high
    watermarks): to act at a moment defined by progress (kill a role mid-work), not by a delay."""

    def __init__(self, bootstrap: str, topics: Sequence[str]) -> None:
        self.topics = list(topics)
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})

    def records(self) -> int:
        total = 0
        for topic in self.topics:
            # KafkaException: the topic is not created, or its leader not known, yet. A busy broker may take
            # seconds to answer: a short timeout would count nothing while the topics grow.
            with contextlib.suppress(KafkaException):
                total += self.consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)[1]
        return total

    def wait_for(self, target: int, still_running: Callable[[], bool], timeout_s: float) -> None:
        """Return once the topics hold ``target`` records or nothing runs that could add more."""
        deadline = time.monotonic() + timeout_s
        while self.records() < target and still_running():
            if time.monotonic() > deadline:
                msg = f"{self.topics} did not reach {target} records in {timeout_s} s"
                raise AssertionError(msg)
            time.sleep(0.02)  # poll interval of the watermark probe

    def close(self) -> None:
        self.consumer.close()
