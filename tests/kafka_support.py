"""Helpers for tests against the real broker."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient, NewTopic

from topics.log_reader import read_to_end as _read_to_end


def create_topic(bootstrap: str, name: str, partitions: int = 1, timeout_s: float = 30.0) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future it answers
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1)], operation_timeout=timeout_s
    )
    futures[name].result(timeout=timeout_s)


def read_to_end(bootstrap: str, topic: str, **kwargs):
    return _read_to_end({"bootstrap.servers": bootstrap}, topic, **kwargs)
