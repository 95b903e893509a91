"""Where a media reference's bytes are: in the reference itself, or in a file under the source root."""

from __future__ import annotations

import io
import posixpath
from pathlib import Path

from connectors.media.errors import MediaError
from connectors.readers.base import MediaRef
from connectors.storage import ObjectChangedError, ObjectMissingError, Storage


def media_input(ref: MediaRef, root: Path | Storage | None) -> io.BytesIO | Path:
    """The reference's bytes as a stream, or its file: an existing regular file under ``root``.

    ``MediaError`` for empty bytes, a path that leaves the root (absolute, or through ``..`` or a link), or
    a file that is missing; ``ValueError`` for a path reference when no root is configured."""
    if ref.data is not None:
        if not ref.data:
            raise MediaError(f"{ref.kind} data is empty (0 bytes)")
        return io.BytesIO(ref.data)
    if root is None:
        msg = f"{ref.kind} at {ref.where} names the file {ref.path!r}, but no source root is configured for media"
        raise ValueError(msg)
    if isinstance(root, Storage):
        return _object_under(root, str(ref.path), ref.kind)
    return _file_under(root, str(ref.path), ref.kind)


def _object_under(storage: Storage, path: str, kind: str) -> io.BytesIO:
    """The bytes of object ``path`` under an object store's source root (one GET of the whole object)."""
    normal = posixpath.normpath(path)
    if path.startswith("/") or normal == ".." or normal.startswith("../"):
        raise MediaError(f"{kind} path {path!r} leads outside the source root {storage.describe()}")
    try:
        size = storage.info(normal).size
        data = storage.read_range(normal, 0, size)
    except (ObjectMissingError, ObjectChangedError) as exc:
        raise MediaError(f"{kind} file {path!r} does not exist under the source root: {exc}") from exc
    if not data:
        raise MediaError(f"{kind} file {path!r} is empty (0 bytes)")
    return io.BytesIO(data)


def _file_under(root: Path, path: str, kind: str) -> Path:
    if Path(path).is_absolute():
        raise MediaError(f"{kind} path {path!r} is absolute; media paths are relative to the source root")
    full = (root / path).resolve()
    if not full.is_relative_to(root.resolve()):
        raise MediaError(f"{kind} path {path!r} leads outside the source root {root}")
    if not full.is_file():
        raise MediaError(f"{kind} file {path!r} does not exist under the source root {root}")
    if full.stat().st_size == 0:
        raise MediaError(f"{kind} file {path!r} is empty (0 bytes)")
    return full
