"""The storage a source's files live in: list them, read a byte range, open one as a seekable file."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO

from connectors.storage.errors import StorageNotFoundError
from topics.formats.file_formats import glob_alternatives


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object (or file): ``path`` relative to the source root with '/' separators, its size in
    bytes and its ETag (``""`` where the storage has none, a local disk)."""

    path: str
    size: int
    etag: str = ""


@dataclass(frozen=True, slots=True)
class StoredBytes:
    """Bytes of an object as the store keeps them, with the ``Content-Encoding`` the store gives the object
    (``""`` for none, and on a local disk): ``gzip`` says the bytes are a gzip stream."""

    data: bytes
    content_encoding: str = ""


class Storage(ABC):
    """Objects under one root. ``etag`` arguments pin the version read: a request for another version is
    refused (``ObjectChangedError``), a vanished object is ``ObjectMissingError``; ``""`` reads any version."""

    remote: bool = True

    @abstractmethod
    def list(self) -> list[ObjectInfo]:
        """Every object under the root, sorted by path."""

    @abstractmethod
    def probe(self) -> None:
        """Raise the storage's error (``StorageError``: access denied, no such bucket, no answer; or
        ``StorageNotFoundError`` when the root holds nothing) with one cheap request; a local root: nothing."""

    @abstractmethod
    def info(self, path: str) -> ObjectInfo:
        """Size and ETag of one object, as it is now."""

    @abstractmethod
    def read_range(self, path: str, start: int, stop: int, etag: str = "") -> bytes:
        """Bytes ``[start, stop)`` of the object."""

    def read_stored(self, path: str, start: int, stop: int, etag: str = "") -> StoredBytes:
        """:meth:`read_range` with the object's ``Content-Encoding``, from the answer to the same request."""
        return StoredBytes(self.read_range(path, start, stop, etag))

    @abstractmethod
    def open(self, path: str, etag: str = "", *, size: int | None = None, buffer_bytes: int = 1 << 20) -> BinaryIO:
        """A seekable read-only binary file over the object, reading ahead at most ``buffer_bytes``."""

    @abstractmethod
    def describe(self, path: str = "") -> str:
        """Where ``path`` is, for messages: ``s3://bucket/prefix/path`` or a local path."""


class LocalStorage(Storage):
    """Files under a local folder."""

    remote = False

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def list(self) -> list[ObjectInfo]:
        found = (p for p in self.root.rglob("*") if p.is_file())
        return sorted((ObjectInfo(p.relative_to(self.root).as_posix(), p.stat().st_size) for p in found), key=_path)

    def probe(self) -> None:
        if not self.root.is_dir():
            raise StorageNotFoundError(f"{self.root} does not exist or is not a directory")

    def info(self, path: str) -> ObjectInfo:
        return ObjectInfo(path, (self.root / path).stat().st_size)

    def read_range(self, path: str, start: int, stop: int, etag: str = "") -> bytes:
        with (self.root / path).open("rb") as file:
            file.seek(start)
            return file.read(max(stop - start, 0))

    def open(self, path: str, etag: str = "", *, size: int | None = None, buffer_bytes: int = 1 << 20) -> BinaryIO:
        return (self.root / path).open("rb")

    def describe(self, path: str = "") -> str:
        return str(self.root / path) if path else str(self.root)


def _path(info: ObjectInfo) -> str:
    return info.path


def glob_matches(pattern: str, path: str) -> bool:
    """Whether ``path`` (relative, '/' separators) matches ``pattern`` as ``Path.glob`` would: ``*``, ``?``
    and ``[...]`` within one segment, ``**`` any number of whole segments; or one of its ``{a,b}`` alternatives
    (``topics.formats.file_formats.glob_alternatives``), as a reader globs each of them on a local disk."""
    return _glob_regex(pattern).fullmatch(path) is not None


@lru_cache(maxsize=64)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{_alternative_regex(each)})" for each in glob_alternatives(pattern)))


def _alternative_regex(pattern: str) -> str:
    parts = []
    segments = pattern.strip("/").split("/")
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "**":
            parts.append("(?:[^/]+/)*" if not last else "(?:[^/]+/)*[^/]+")
            continue
        parts.append(_segment_regex(segment) + ("" if last else "/"))
    return "".join(parts)


def _segment_regex(segment: str) -> str:
    out = []
    i = 0
    while i < len(segment):
        char = segment[i]
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[" and (end := segment.find("]", i + 2)) != -1:
            body = segment[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]")
            i = end
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)
