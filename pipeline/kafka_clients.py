"""Kafka clients configured for mixflow's roles, and the commit-or-abort rule for transactions."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from topics.errors import MixflowError

log = logging.getLogger(__name__)

KafkaConfig = Mapping[str, Any]


def transactional_producer(
    base: KafkaConfig,
    transactional_id: str,
    *,
    transaction_timeout_ms: int = 60_000,
    init_timeout_s: float = 60.0,
) -> Producer:
    """A producer for exactly-once writes, with its transactions initialised.

    Initialising fences any earlier producer with the same ``transactional_id`` and aborts its open
    transaction, which is how a restarted role takes over from its dead predecessor at once."""
    config = {
        **base,
        "transactional.id": transactional_id,
        # An open transaction of a killed producer blocks read_committed readers until this passes.
        "transaction.timeout.ms": transaction_timeout_ms,
        # Batch many small samples per request; 5 ms of latency is nothing next to a training step.
        "linger.ms": 5,
        "batch.size": 1_048_576,
        # Token ids compress well and cheaply.
        "compression.type": "lz4",
        # Room for a whole work unit or step in flight before produce() has to wait.
        "queue.buffering.max.kbytes": 524_288,
        "queue.buffering.max.messages": 1_000_000,
        # Batches of one step can be several MB (the broker allows 64 MB).
        "message.max.bytes": 67_108_864,
    }
    producer = Producer(config)
    try:
        producer.init_transactions(init_timeout_s)
    except KafkaException as exc:
        where = base.get("bootstrap.servers")
        msg = f"cannot initialise transactions for {transactional_id!r} at {where}: {exc}"
        raise MixflowError(msg) from exc
    return producer


def read_committed_consumer(base: KafkaConfig, group_id: str, **overrides: Any) -> Consumer:
    config = {
        **base,
        "group.id": group_id,
        # Offsets are committed inside the producer's transactions, never on their own.
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        # Records of aborted or open transactions are never seen.
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        **overrides,
    }
    return Consumer(config)


def produce(producer: Producer, topic: str, value: bytes, **kwargs: Any) -> None:
    """``producer.produce`` that waits for room when the local queue is full instead of failing."""
    while True:
        try:
            producer.produce(topic, value, **kwargs)
            return
        except BufferError:
            producer.poll(0.1)


def commit_or_abort(producer: Producer, timeout_s: float = 60.0) -> bool:
    """Commit the open transaction. True when committed; False when it had to be aborted (the caller
    redoes its work); raises MixflowError on a fatal error (the producer is fenced or broken and the
    process must start a new one)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            producer.commit_transaction(max(1.0, deadline - time.monotonic()))
            return True
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.retriable() and time.monotonic() < deadline:
                log.warning("commit of transaction failed, retrying: %s", error)
                continue
            if error.txn_requires_abort():
                log.warning("transaction aborted: %s", error)
                abort(producer, timeout_s)
                return False
            msg = f"transaction cannot commit: {error} (fatal={error.fatal()})"
            raise MixflowError(msg) from exc


def abort(producer: Producer, timeout_s: float = 60.0) -> None:
    try:
        producer.abort_transaction(timeout_s)
    except KafkaException as exc:
        msg = f"transaction cannot abort: {exc.args[0]}"
        raise MixflowError(msg) from exc
