"""The storage's retry policy (``topics.retry.RetryPolicy``): a request that failed with a
``TransientError`` is tried again with jittered backoff until the deadline, then reported as
``StorageUnavailableError``; the others are raised at once, as the storage error they are."""

from __future__ import annotations

import logging

from connectors.storage.errors import StorageUnavailableError
from topics.retry import GaveUp, RetryPolicy


class TransientError(Exception):
    """A failed request worth trying again; ``reason`` says what failed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _transient(exc: Exception) -> str | None:
    return exc.reason if isinstance(exc, TransientError) else None


def _unavailable(gave_up: GaveUp) -> StorageUnavailableError:
    tries = f"{gave_up.tries} tr{'y' if gave_up.tries == 1 else 'ies'}"
    return StorageUnavailableError(f"{gave_up.what}: {gave_up.reason} ({tries} in {gave_up.took_s:.0f} s)")


STORAGE_RETRY = RetryPolicy(
    transient=_transient,
    unavailable=_unavailable,
    log=logging.getLogger(__name__),
    deadline_s=60.0,
    backoff_s=0.1,
    max_backoff_s=4.0,
    jitter=True,
)
"""How long and how often a storage request is tried; a source's spec sets ``deadline_s``
(``storage.retry_deadline_s``)."""
