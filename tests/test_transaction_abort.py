"""``TransactionalRole.open_transaction`` against the real broker: when the work fails after the broker has
ended the transaction at its timeout, the abort that follows fails too, and the work's own error is what the
role raises (a loader stopping on a changed object says so, rather than that its producer broke)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from pipeline.kafka.role_protocol import TransactionalRole
from tests.kafka_support import create_topic
from topics.kafka.clients import KafkaConfig, produce, transactional_producer

TIMEOUT_MS = 1000
BROKER_ABORTS_WITHIN_S = 60  # the stack checks for timed-out transactions every 10 s


class _Role(TransactionalRole):
    kind = "test"

    def __init__(self, config: KafkaConfig, transactional_id: str) -> None:
        super().__init__(config, transaction_timeout_ms=TIMEOUT_MS)
        self._transactional_id = transactional_id

    @property
    def transactional_id(self) -> str:
        return self._transactional_id


class WorkFailed(Exception):
    pass


@pytest.mark.kafka
def test_the_works_error_propagates_when_the_broker_ended_the_transaction_first(
    kafka_bootstrap: str, unique_name: str
) -> None:
    config = {"bootstrap.servers": kafka_bootstrap}
    topic, transactional_id = f"{unique_name}.out", f"{unique_name}.role"
    create_topic(kafka_bootstrap, topic)
    role = _Role(config, transactional_id)
    producer = transactional_producer(config, transactional_id, transaction_timeout_ms=TIMEOUT_MS)
    committed = Consumer({**config, "group.id": f"{unique_name}.probe", "isolation.level": "read_committed"})

    def work() -> list[TopicPartition]:
        produce(producer, topic, b"never committed")
        producer.flush(30)
        # The broker aborts the open transaction once it has run past its timeout: the abort marker moves the
        # topic's last stable offset past the record.
        deadline = time.monotonic() + BROKER_ABORTS_WITHIN_S
        while committed.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1] < 2:
            assert time.monotonic() < deadline, (
                f"the broker did not abort the transaction within {BROKER_ABORTS_WITHIN_S} s"
            )
            time.sleep(0.2)  # polling the broker's offsets: nothing to wait on for its own timer
        raise WorkFailed("the work's own error")

    try:
        with pytest.raises(WorkFailed, match="the work's own error"):
            role.open_transaction(producer, None, work, "a unit")
    finally:
        committed.close()
