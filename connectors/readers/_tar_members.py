"""The members of an uncompressed tar shard, grouped into samples the way the ``webdataset`` library groups
them, from the tar headers alone: a member's bytes are read only when asked for.

The rules are those of ``webdataset`` 1.0.2 (``webdataset.tariterators``): only regular files count; a name
that starts and ends with ``__`` (at the top level) or whose first part does (``__[^/]*__($|/)``) is skipped;
a name splits into a key, the path up to the first dot of its base name, and an extension, the rest,
lower-cased (``base_plus_ext``; a base name without a dot is skipped); consecutive members with the same
key form one sample (``group_by_keys``). Its code is not imported here: importing the ``webdataset`` package
loads torch, which a loader does not load.
"""

from __future__ import annotations

import gzip
import re
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

# webdataset.tariterators.base_plus_ext
_KEY_AND_EXTENSION = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
# webdataset.tariterators.tar_file_iterator's skip_meta, and its check of meta_prefix and meta_suffix
_SKIPPED = re.compile(r"__[^/]*__($|/)")
_META = "__"
_TRAILER_CHUNK = 1 << 16
GZIPPED_SUFFIXES = (".tar.gz", ".tgz")


def gzipped(path: str) -> bool:
    """Whether ``path`` names a gzip-compressed shard (``.tar.gz``, ``.tgz``)."""
    return path.lower().endswith(GZIPPED_SUFFIXES)


class Gunzipped(gzip.GzipFile):
    """A gzip stream read forward, its corruption and truncation an ``OSError`` as a tar archive's are."""

    def read(self, size: int | None = -1) -> bytes:
        try:
            return super().read(size)
        except (EOFError, zlib.error) as exc:
            raise OSError(f"not a readable gzip stream: {exc}") from exc

    def seek(self, offset: int, whence: int = 0) -> int:
        try:
            return super().seek(offset, whence)
        except (EOFError, zlib.error) as exc:
            raise OSError(f"not a readable gzip stream: {exc}") from exc


def gunzipped_copy(file: BinaryIO) -> BinaryIO:
    """The decompressed bytes of the gzip stream ``file`` in a temporary file, which a tar shard can seek in
    (its members are read back after their key's last header); deleted when closed."""
    copy = tempfile.TemporaryFile()  # noqa: SIM115 (returned open, closed by the caller)
    try:
        with Gunzipped(fileobj=file, mode="rb") as stream:
            shutil.copyfileobj(stream, copy, 1 << 20)
    except BaseException:
        copy.close()
        raise
    copy.seek(0)
    return copy  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class TarEntry:
    """One member: ``name`` in the archive, its ``key`` and lower-cased ``extension``, where its header
    starts and where its bytes end in the file."""

    name: str
    key: str
    extension: str
    header_offset: int
    end: int
    info: tarfile.TarInfo


@dataclass(frozen=True, slots=True)
class KeyGroup:
    """The consecutive members of one key: one sample."""

    key: str
    members: tuple[TarEntry, ...]

    @property
    def start(self) -> int:
        return self.members[0].header_offset

    @property
    def end(self) -> int:
        return self.members[-1].end


@dataclass(frozen=True, slots=True)
class TarBreak:
    """Reading stopped: the archive is not a tar, is cut short or holds bytes that are no tar header.
    ``key``: the key whose members were being gathered, if any."""

    key: str | None
    reason: str


def key_and_extension(name: str) -> tuple[str, str] | None:
    """``("a/b", "seg.jpg")`` for ``a/b.seg.JPG``; None where webdataset skips the member."""
    if ("/" not in name and name.startswith(_META) and name.endswith(_META)) or _SKIPPED.match(name):
        return None
    match = _KEY_AND_EXTENSION.match(name)
    if match is None:
        return None
    return match.group(1), match.group(2).lower()


class TarShard:
    """A tar archive read from ``start``, the offset of a member's header (0: the whole archive)."""

    def __init__(self, file: BinaryIO, start: int = 0) -> None:
        self._file = file
        self._start = start
        self._tar: tarfile.TarFile | None = None

    def groups(self) -> Iterator[KeyGroup | TarBreak]:
        """The samples in archive order; a ``TarBreak`` last where the archive stops making sense."""
        current: list[TarEntry] = []
        try:
            self._file.seek(self._start)
            with tarfile.open(fileobj=self._file, mode="r:") as tar:
                self._tar = tar
                for entry in self._entries(tar):
                    if current and entry.key != current[0].key:
                        yield KeyGroup(current[0].key, tuple(current))
                        current = []
                    current.append(entry)
                if current:
                    yield KeyGroup(current[0].key, tuple(current))
        except (tarfile.TarError, OSError) as exc:
            yield TarBreak(current[0].key if current else None, f"not a readable uncompressed tar archive: {exc}")

    def read(self, entry: TarEntry) -> bytes:
        """The member's bytes (``tarfile.TarError`` or ``OSError`` where the file is cut short)."""
        if self._tar is None:
            raise RuntimeError("read a member of a group that groups() gave")
        member = self._tar.extractfile(entry.info)
        if member is None:
            raise tarfile.ReadError(f"member {entry.name} is not a regular file")
        data = member.read()
        if len(data) != entry.info.size:
            raise tarfile.ReadError(f"member {entry.name} holds {len(data)} of its {entry.info.size} bytes")
        return data

    def _entries(self, tar: tarfile.TarFile) -> Iterator[TarEntry]:
        while (info := tar.next()) is not None:
            tar.members = []  # as webdataset does: a shard's listing is not kept
            if not info.isreg():
                continue
            named = key_and_extension(info.name)
            if named is not None:
                yield TarEntry(info.name, *named, info.offset, info.offset_data + info.size, info)
        self._check_trailer(tar.offset)

    def _check_trailer(self, offset: int) -> None:
        """``tarfile`` ends an archive quietly at a header it cannot parse; only zeros may follow the end."""
        self._file.seek(offset)
        position = offset
        while chunk := self._file.read(_TRAILER_CHUNK):
            if chunk.count(0) != len(chunk):
                first = position + next(i for i, byte in enumerate(chunk) if byte)
                raise tarfile.ReadError(f"bytes at offset {first}, after the last member, are not a tar header")
            position += len(chunk)
