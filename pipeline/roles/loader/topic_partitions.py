"""The partition count of one of the job's topics, asked of the cluster."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient

from topics.kafka.clients import KafkaConfig
from topics.kafka.retry import KAFKA_RETRY


def partition_count(config: KafkaConfig, topic: str) -> int:
    """The partitions of ``topic``; a broker that is away is waited for (``KAFKA_RETRY``)."""
    admin = AdminClient(dict(config))
    metadata = KAFKA_RETRY.call(lambda: admin.list_topics(topic, timeout=30), f"describing {topic}")
    return len(metadata.topics[topic].partitions)
