"""One retry policy for storage requests: transient errors are retried with backoff until a deadline,
then reported; the others are raised at once, as the storage error they are."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from connectors.storage.errors import StorageUnavailableError

log = logging.getLogger(__name__)
T = TypeVar("T")


class TransientError(Exception):
    """A failed request worth trying again; ``reason`` says what failed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """``deadline_s``: how long one request may keep failing transiently before it is reported; the wait
    between tries doubles from ``first_backoff_s`` up to ``max_backoff_s``, with jitter."""

    deadline_s: float = 60.0
    first_backoff_s: float = 0.1
    max_backoff_s: float = 4.0

    def run(self, what: str, call: Callable[[], T], deadline_s: float | None = None) -> T:
        """``call()``, tried again while it raises ``TransientError`` and ``deadline_s`` (default the
        policy's) has not passed; then ``StorageUnavailableError`` naming ``what`` and the last reason."""
        limit = self.deadline_s if deadline_s is None else deadline_s
        began = time.monotonic()
        deadline = began + limit
        backoff = self.first_backoff_s
        tries = 0
        while True:
            tries += 1
            try:
                return call()
            except TransientError as exc:
                wait = backoff * random.uniform(0.5, 1.0)
                if time.monotonic() + wait > deadline:
                    took = time.monotonic() - began
                    msg = f"{what}: {exc.reason} ({tries} tr{'y' if tries == 1 else 'ies'} in {took:.0f} s)"
                    raise StorageUnavailableError(msg) from exc
                log.warning("%s: %s; trying again in %.2f s", what, exc.reason, wait)
                time.sleep(wait)  # a backoff between requests, not a wait for an event
                backoff = min(2 * backoff, self.max_backoff_s)
