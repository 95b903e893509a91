"""One retry policy for every call that may fail for a moment: a Kafka call a role makes outside a
transaction, a request to an object store. A call that fails transiently (as the policy's ``transient``
predicate judges) is tried again with a doubling backoff until one deadline; past it, the caller gets the
policy's ``unavailable`` error, saying what it was doing and why. Other errors are raised at once.

Each kind of call has its instance beside its client: ``topics.kafka.retry.KAFKA_RETRY`` for Kafka calls,
``connectors.storage.retry.STORAGE_RETRY`` for storage requests."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

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
