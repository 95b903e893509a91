"""What can go wrong reading a source from storage, each with a message naming the bucket, key and reason.

An object that changed or vanished since planning is an ``OSError`` as well: a reader turns it into a dead
letter for the unit, as it does a local file it cannot read. The others stop the loader: the data is fine,
the storage is not (credentials refused, no such bucket, an endpoint that stays away past the deadline).
Who asked never makes a dead letter: a 404 that is about the credentials (an unknown key on some stores) is
``StorageAccessError``, and an object is missing only once a listing under the same credentials says so. With
``S3Settings.stop_on_changed`` a changed or vanished object is ``ObjectRefusedError`` instead, which no
reader catches: the loader stops."""

from __future__ import annotations

from topics.errors import MixflowError, NotFoundError, RefusedError


class StorageError(MixflowError):
    """A permanent problem with the storage itself: access denied, a bad or missing bucket, an endpoint
    that does not answer, an invalid setting."""


class StorageAccessError(StorageError, RefusedError):
    """The store refused these credentials: access denied, an unknown or revoked key, a bad signature or an
    expired token. Never retried, never a dead letter: the loader stops (exit 5) and ``mixflow run`` does not
    start it again, since the same request would be refused again."""


class StorageNotFoundError(StorageError, NotFoundError):
    """A bucket (or a prefix with no object) that does not exist."""


class StorageUnavailableError(StorageError):
    """Transient errors (timeouts, 5xx, SlowDown, connection resets) went on past the retry deadline."""


class ObjectChangedError(StorageError, OSError):
    """The object's ETag is not the one planned (412 on ``If-Match``): it was overwritten after planning."""


class ObjectMissingError(StorageError, OSError):
    """The object is gone (404) since planning, as the store says of the key itself (``NoSuchKey``, or a bare
    404 to a HEAD) and a listing of the bucket under the same credentials confirms."""


class ObjectRefusedError(RefusedError, StorageError):
    """An object changed or vanished since planning, where the source's spec says to stop
    (``storage.on_changed_object: stop``): not an ``OSError``, so that it ends the loader, not the unit."""
