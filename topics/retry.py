"""One retry policy for every call that may fail for a moment: a Kafka call a role makes outside a
transaction, a request to an object store. A call that fails transiently (as the policy's ``transient``
predicate judges) is tried again with a doubling backoff until one deadline; past it, the caller gets the
policy's ``unavailable`` error, saying what it was doing and why. Other errors are raised at once.

``KAFKA_RETRY`` is the policy of Kafka calls: retriable errors (a broker that went away, a coordinator or
leader that moved, a request that timed out); the storage policy lives with the storage
(``connectors.storage.retry``)."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from confluent_kafka import KafkaError, KafkaException

from topics.errors import BrokerUnreachableError

T = TypeVar("T")

Transient = Callable[[Exception], str | None]
"""Why a failed call is worth trying again (its reason, for logs and the final error), or ``None`` where
the error is to be raised as it is."""


class GaveUp(NamedTuple):
    """A call that kept failing transiently until the deadline: what it did, the last reason, how often and
    for how long it was tried, and the deadline it had."""

    what: str
    reason: str
    tries: int
    took_s: float
    deadline_s: float


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retry a call while ``transient`` finds a reason in its error, waiting ``backoff_s`` and then twice as
    long each time up to ``max_backoff_s`` (each wait a random 50-100 % of that with ``jitter``), for at most
    ``deadline_s`` in all; then raise ``unavailable(GaveUp(...))``. Each retry is a warning on ``log``."""

    transient: Transient
    unavailable: Callable[[GaveUp], Exception]
    log: logging.Logger
    deadline_s: float
    backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    jitter: bool = False

    def call(self, function: Callable[[], T], what: str, deadline_s: float | None = None) -> T:
        """``function()``, retried under this policy (with ``deadline_s`` in place of the policy's when given);
        ``what`` says in logs and errors what it does."""
        limit = self.deadline_s if deadline_s is None else deadline_s
        began = time.monotonic()
        backoff = self.backoff_s
        tries = 0
        while True:
            tries += 1
            try:
                return function()
            except Exception as exc:
                reason = self.transient(exc)
                if reason is None:
                    raise
                wait = backoff * random.uniform(0.5, 1.0) if self.jitter else backoff
                if time.monotonic() + wait > began + limit:
                    gave_up = GaveUp(what, reason, tries, time.monotonic() - began, limit)
                    raise self.unavailable(gave_up) from exc
                self.log.warning("%s: %s; trying again in %.2f s", what, reason, wait)
                time.sleep(wait)  # a backoff between tries, not a wait for an event
                backoff = min(2 * backoff, self.max_backoff_s)


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
