"""How a source reaches an S3-compatible store: endpoint, addressing, credentials, timeouts and retries; shared by
its listing client (``s3``) and its GET client (``s3_get``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from connectors.storage.retry import STORAGE_RETRY
from topics.retry import RetryPolicy

AddressingStyle = Literal["path", "virtual", "auto"]
FIRST_CONTACT_S = 5.0  # how long a command tries an endpoint it has never reached


@dataclass(frozen=True, slots=True)
class S3Settings:
    """How to reach the store. Credentials left ``None`` come from the standard AWS chain (environment,
    shared files, ``profile``, instance roles); given ones are never shown (``repr``) nor logged.
    ``first_contact_s``: how long an endpoint never reached yet is tried before it is reported unreachable
    (after the first answer, transient errors are retried for ``retry.deadline_s``). A request waits for its
    answer at most ``connect_timeout_s`` and ``read_timeout_s``, each capped at the smaller of those two.
    ``stop_on_changed``: a read pinned to an ETag finds the object changed or gone: ``ObjectRefusedError``
    rather than the ``OSError`` a reader turns into a dead letter."""

    endpoint_url: str | None = None
    region: str | None = None
    addressing_style: AddressingStyle = "auto"
    profile: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    retry: RetryPolicy = STORAGE_RETRY
    first_contact_s: float = FIRST_CONTACT_S
    stop_on_changed: bool = False
