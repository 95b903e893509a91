"""The retry policy of Kafka calls (``topics.retry.RetryPolicy``): retriable errors (a broker that went away,
a coordinator or leader that moved, a request that timed out) are retried until the deadline, then reported
as ``KafkaUnavailableError``."""

from __future__ import annotations

import logging
from collections.abc import Collection

from confluent_kafka import KafkaError, KafkaException

from topics.errors import BrokerUnreachableError
from topics.retry import GaveUp, RetryPolicy, Transient

# Errors librdkafka does not flag retriable() on every call, but that only mean "not now": the broker
# restarts, a coordinator or partition leader moves, or a request outlived its timeout meanwhile.
_NOT_NOW = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._WAIT_COORD,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        # The client's own metadata lacks a partition of a topic it uses while the broker is restarting.
        KafkaError._UNKNOWN_PARTITION,
    }
)


class KafkaUnavailableError(BrokerUnreachableError):
    """Kafka kept answering with retriable errors past the retry deadline."""


def is_retriable(error: KafkaError) -> bool:
    """Whether the call that failed with ``error`` may succeed if made again. Never an error that needs
    the open transaction aborted (messages that timed out in a broker's absence, say): the caller must
    abort and redo the transaction's work, however transient the cause."""
    return not error.fatal() and not error.txn_requires_abort() and (error.retriable() or error.code() in _NOT_NOW)


def kafka_transient(also: Collection[int] = ()) -> Transient:
    """The predicate of Kafka calls: a ``KafkaException`` whose error is retriable, or has one of the codes
    in ``also`` (such as UNKNOWN_TOPIC_OR_PART for a topic created a moment ago)."""

    def transient(exc: Exception) -> str | None:
        error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
        if isinstance(error, KafkaError) and (is_retriable(error) or error.code() in also):
            return str(error)
        return None

    return transient


def _kafka_unavailable(gave_up: GaveUp) -> KafkaUnavailableError:
    return KafkaUnavailableError(
        f"{gave_up.what}: Kafka did not recover within {gave_up.deadline_s:g} s (last error: {gave_up.reason})"
    )


KAFKA_RETRY = RetryPolicy(
    transient=kafka_transient(),
    unavailable=_kafka_unavailable,
    log=logging.getLogger("mixflow.kafka"),
    deadline_s=120.0,
    backoff_s=0.1,
    max_backoff_s=5.0,
)
"""The policy of every Kafka call a role makes outside a transaction."""
