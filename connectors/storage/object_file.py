"""A seekable read-only file over one object, each read a range request: what pyarrow and the line readers
read a remote object through, holding at most one read-ahead buffer in memory."""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, BinaryIO, cast

if TYPE_CHECKING:
    from connectors.storage.base import Storage


class ObjectRangeIO(io.RawIOBase):
    """Bytes of ``path`` of ``storage``, version ``etag``, of ``size`` bytes; every ``readinto`` is one
    ranged GET (``Storage.read_stored``) from the current position. ``content_encoding``: the object's, as the
    last GET's answer gave it (``None`` before the first)."""

    def __init__(self, storage: Storage, path: str, size: int, etag: str) -> None:
        super().__init__()
        self.storage = storage
        self.path = path
        self.size = size
        self.etag = etag
        self.position = 0
        self.content_encoding: str | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.position, os.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset} in {self.storage.describe(self.path)}")
        self.position = base + offset
        return self.position

    def readall(self) -> bytes:
        """The rest of the object, in one request."""
        data = b""
        if self.position < self.size:
            data = self._get(self.size)
        self.position += len(data)
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        wanted = min(len(buffer), self.size - self.position)
        if wanted <= 0:
            return 0
        data = self._get(self.position + wanted)
        view = memoryview(buffer).cast("B")
        view[: len(data)] = data
        self.position += len(data)
        return len(data)

    def _get(self, stop: int) -> bytes:
        stored = self.storage.read_stored(self.path, self.position, stop, self.etag)
        self.content_encoding = stored.content_encoding
        return stored.data


def open_object(storage: Storage, path: str, size: int, etag: str, buffer_bytes: int) -> BinaryIO:
    """``ObjectRangeIO`` behind a read-ahead buffer of ``buffer_bytes``; reads longer than the buffer go to
    the object directly, in one request each. ``buffer_bytes`` 0: no buffer, each read one request of exactly
    its bytes (for a reader that asks for whole ranges, as pyarrow does for Parquet's column chunks)."""
    raw = ObjectRangeIO(storage, path, size, etag)
    if buffer_bytes <= 0:
        return cast(BinaryIO, raw)
    return cast(BinaryIO, io.BufferedReader(raw, buffer_size=max(buffer_bytes, io.DEFAULT_BUFFER_SIZE)))


def content_encoding(file: BinaryIO) -> str:
    """The ``Content-Encoding`` of the object ``file`` reads (as ``open_object`` opened it), from its first ranged
    GET: made here (filling the read-ahead buffer from the file's position; without a buffer, a GET of one byte),
    unless a read made it already.
    ``""`` for a local file, an object without one, or one with no bytes left to read."""
    if isinstance(file, ObjectRangeIO):  # opened without a buffer: a read of one byte, then back
        if file.content_encoding is None and file.position < file.size:
            position = file.position
            file.read(1)
            file.seek(position)
        return file.content_encoding or ""
    if not isinstance(file, io.BufferedReader) or not isinstance(file.raw, ObjectRangeIO):
        return ""
    if file.raw.content_encoding is None:
        file.peek(1)
    return file.raw.content_encoding or ""
