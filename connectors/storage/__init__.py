"""Where a source's files live: a local folder or an S3-compatible bucket, behind one small interface."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import lazy_loader

from connectors.storage.base import LocalStorage, ObjectInfo, Storage, StoredBytes, glob_matches
from connectors.storage.errors import (
    ObjectChangedError,
    ObjectMissingError,
    ObjectRefusedError,
    StorageAccessError,
    StorageError,
    StorageNotFoundError,
    StorageUnavailableError,
)
from connectors.storage.retry import STORAGE_RETRY
from connectors.storage.uri import ObjectUri, is_object_uri

if TYPE_CHECKING:  # the lazy names' types, for a type checker
    from connectors.storage.s3 import S3Settings, S3Storage


def storage_for(root: str | Path, settings: object | None = None) -> Storage:
    """The storage of a source root: ``s3://bucket/prefix`` (with ``S3Settings``) or a local folder."""
    if is_object_uri(root):
        from connectors.storage.s3 import S3Settings, S3Storage

        return S3Storage(str(root), settings if isinstance(settings, S3Settings) else None)
    return LocalStorage(root)


__getattr__, _, _ = lazy_loader.attach(__name__, submod_attrs={"s3": ["S3Settings", "S3Storage"]})
__all__ = [
    "STORAGE_RETRY",
    "LocalStorage",
    "ObjectChangedError",
    "ObjectInfo",
    "ObjectMissingError",
    "ObjectRefusedError",
    "ObjectUri",
    "S3Settings",
    "S3Storage",
    "Storage",
    "StorageAccessError",
    "StorageError",
    "StorageNotFoundError",
    "StorageUnavailableError",
    "StoredBytes",
    "glob_matches",
    "is_object_uri",
    "storage_for",
]
