"""One retry policy for every Kafka call a role makes outside a transaction: retriable errors (a broker
that went away, a coordinator or leader that moved, a request that timed out) are retried with backoff
until one deadline; past it, the role fails with a message saying what it was doing and why."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException

from topics.errors import BrokerUnreachableError

log = logging.getLogger("mixflow.kafka")
T = TypeVar("T")

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


@dataclass(frozen=True)
class RetryPolicy:
    """Retry a call while it fails with a retriable Kafka error, backing off from ``backoff_s`` up to
    ``max_backoff_s``, for at most ``deadline_s`` in all. ``also`` adds error codes to retry on (such as
    UNKNOWN_TOPIC_OR_PART for a topic created a moment ago)."""

    deadline_s: float = 120.0
    backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    also: frozenset[int] = frozenset()

    def call(self, function: Callable[[], T], what: str) -> T:
        """``function()``, retried under this policy; ``what`` says in logs and errors what it does."""
        deadline = time.monotonic() + self.deadline_s
        backoff = self.backoff_s
        while True:
            try:
                return function()
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if not isinstance(error, KafkaError) or not (is_retriable(error) or error.code() in self.also):
                    raise
                if time.monotonic() + backoff > deadline:
                    msg = f"{what}: Kafka did not recover within {self.deadline_s:g} s (last error: {error})"
                    raise KafkaUnavailableError(msg) from exc
                log.warning("%s failed, retrying in %.1f s: %s", what, backoff, error)
                time.sleep(backoff)  # backing off from a broker that is not answering
                backoff = min(2 * backoff, self.max_backoff_s)


KAFKA_RETRY = RetryPolicy()
"""The policy every role uses."""
