"""WebDataset tar shards of images and clips with their text; the row is the sample's 0-based index in the shard.

Members are grouped into samples by key as the ``webdataset`` library does (``_tar_members``): ``a/000001.jpg``
and ``a/000001.txt`` are the sample of key ``a/000001``, with the extensions ``jpg`` and ``txt``. An
extension whose last part is an image's (``jpg jpeg png webp bmp gif tif tiff``) or a clip's (``mp4 webm
mkv avi mov``) is a medium of that kind. A sample is one of:

* a pair: its media (images, then clips, each in archive order), then a caption: the ``.txt`` member
  (UTF-8), or else the ``.caption`` member, or else the ``.json`` member's text (``{"caption": ...}`` or
  ``{"text": ...}``, the names of ``MediaFields.text``). ``000001.jpg`` + ``000001.txt`` reads as ``(image, caption)``.
* a conversation: its ``.json`` holds one (``chat_parts``), its media the key's members in archive order.
* an interleaved document: its ``.json`` holds ``{"segments": [...]}`` (``connectors.readers.media_parts``),
  whose images and clips name members of the same key by extension: ``{"image": "1.jpg"}`` is the member
  ``000001.1.jpg``. Its ``.txt`` and media no segment names are not read.

A key without media or without text, with an unparsable ``.json``, two members of one extension, or a
segment naming no member of its kind, is a dead letter at ``shard.tar:key=<key>``, as is any later letter about
its document (``Document.where``); a medium is found at ``shard.tar:key=<member name>``. Shards are tar
archives, uncompressed (seekable, split between any two samples) or gzipped (``.tar.gz``, ``.tgz``: one unit
each, read through a decompressed temporary copy, since a member is read after its key's last header); a
shard that cannot be read to its end is planned as one unit, whose reading gives the samples before the break
and a dead letter at the key being read (``shard.tar`` where none is, or where the shard ends before the
samples a unit was planned with).
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import BinaryIO

import numpy as np

from connectors.readers._tar_members import (
    Gunzipped,
    KeyGroup,
    TarBreak,
    TarEntry,
    TarShard,
    gunzipped_copy,
    gzipped,
)
from connectors.readers.base import ContentKind, Document, FileLayout, MediaFields, MediaRef, Reader, location
from connectors.readers.media_parts import BadRecord, MediaResolver, first_present, record_content
from connectors.storage import Storage
from connectors.work_units import WorkUnit
from topics.formats.dead_letter import DeadLetter
from topics.formats.file_formats import FILE_FORMATS
from topics.formats.media import MediaKind

IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff"})
VIDEO_EXTENSIONS = frozenset({"mp4", "webm", "mkv", "avi", "mov"})
TEXT_EXTENSIONS = ("txt", "caption")
"""The members a pair's caption is read from, the first the key has."""


def media_kind(extension: str) -> MediaKind | None:
    """``image`` for ``jpg`` or ``1.jpg``, ``video`` for ``mp4``, None for anything else."""
    last = extension.rsplit(".", 1)[-1]
    if last in IMAGE_EXTENSIONS:
        return "image"
    if last in VIDEO_EXTENSIONS:
        return "video"
    return None


class WebDatasetReader(Reader):
    """Reads the samples of WebDataset shards as documents of parts; ``content`` must be ``"media"``.
    A shard splits between any two samples: a unit seeks to its first sample's first header."""

    file_format = FILE_FORMATS["webdataset"]
    supported_content = ("media",)

    def __init__(
        self,
        source: str,
        root: str | Path,
        glob: str | None = None,
        field: str = "text",
        *,
        content: ContentKind = "media",
        media_fields: MediaFields | None = None,
        storage: Storage | None = None,
    ) -> None:
        super().__init__(source, root, glob, field, content=content, media_fields=media_fields, storage=storage)

    def layout(self, path: str) -> FileLayout:
        starts: list[int] = []
        end = 0
        try:
            size = self.size_of(path)
            with self.open_file(path) as file, _archive(file, path, copy=False) as archive:
                for group in TarShard(archive).groups():
                    if isinstance(group, TarBreak):
                        return FileLayout.unreadable(path, size, group.reason)
                    starts.append(group.start)
                    end = group.end
        except OSError as exc:
            return FileLayout.unreadable(path, 0, f"cannot read: {exc}")
        row_bounds = np.array([*starts, end] if starts else [0], dtype=np.int64)
        # a compressed shard cannot be entered in the middle: one unit, its bounds the decompressed offsets
        whole = np.array([0, len(starts)], dtype=np.int64) if gzipped(path) else None
        return FileLayout(path, size, row_bounds, row_groups=whole)

    def read(self, unit: WorkUnit) -> Iterator[Document | DeadLetter]:
        self.check_unit(unit)
        read = 0  # the unit's samples given so far, each a document or a dead letter
        try:
            with self.open_file(unit.path, unit) as file, _archive(file, unit.path, copy=True) as archive:
                for item in self._read_unit(TarShard(archive, 0 if unit.kind == "file" else unit.byte_offset), unit):
                    read += 1
                    yield item
        except OSError as exc:
            yield self.unit_letter(unit, location(unit.path), f"cannot read: {exc}", first=unit.start + read)

    def _read_unit(self, shard: TarShard, unit: WorkUnit) -> Iterator[Document | DeadLetter]:
        whole = unit.kind == "file"
        # A unit without a byte offset (or the whole file) starts at the first sample and skips to its own.
        row = unit.start if not whole and unit.byte_offset else 0
        for group in shard.groups():
            if isinstance(group, TarBreak):  # the samples from here to the unit's end cannot be read
                where = location(unit.path, key=group.key)
                yield self.unit_letter(unit, where, group.reason, first=max(row, unit.start))
                return
            if whole or row >= unit.start:
                yield self._sample(shard, unit.path, row, group)
            row += 1
            if not whole and row >= unit.stop:
                return
        if not whole:  # the samples it lacks have no key to name: the letter names the shard
            where = location(unit.path)
            reason = f"shard ends at sample {row}, before sample {unit.stop} of {unit.unit_id}"
            yield self.unit_letter(unit, where, reason, first=max(row, unit.start))

    def _sample(self, shard: TarShard, path: str, row: int, group: KeyGroup) -> Document | DeadLetter:
        where = location(path, key=group.key)
        try:
            members = _by_extension(group)
            resolve = _member_resolver(shard, path, members)
            content = record_content(self._record(shard, group, members), self.media_fields, where, resolve)
        except BadRecord as exc:
            return self.dead_letter(where, str(exc))
        except (tarfile.TarError, OSError) as exc:
            return self.dead_letter(where, f"cannot read a member: {exc}")
        return Document(self.source, path, row, parts=content.parts, where=where, trained=content.trained)

    def _record(self, shard: TarShard, group: KeyGroup, members: dict[str, TarEntry]) -> dict[str, object]:
        """The sample as a record for ``record_content``, its media named by member extension: the ``.json``
        when it has segments, else the media members and the ``.json``'s conversation or the caption."""
        fields = self.media_fields
        described = _json_member(shard, members)
        if described is not None and first_present(described, fields.segments) is not None:
            return described
        media: dict[MediaKind, list[str]] = {"image": [], "video": []}
        for entry in group.members:
            if (kind := media_kind(entry.extension)) is not None:
                media[kind].append(entry.extension)
        record: dict[str, object] = {fields.image[0]: media["image"], fields.video[0]: media["video"]}
        if described is not None and (turns := first_present(described, fields.conversations)) is not None:
            record[fields.conversations[0]] = turns
        elif text := next((members[e] for e in TEXT_EXTENSIONS if e in members), None):
            record[fields.text[0]] = _text_member(shard, text)
        elif described is not None:
            record[fields.text[0]] = first_present(described, fields.text)
        return record


def _archive(file: BinaryIO, path: str, *, copy: bool) -> BinaryIO | nullcontext[BinaryIO]:
    """The tar archive of ``file``: itself, or a gzipped shard's stream (read forward: headers only) or its
    decompressed ``copy`` (members read back)."""
    if not gzipped(path):
        return nullcontext(file)
    return gunzipped_copy(file) if copy else Gunzipped(fileobj=file, mode="rb")  # type: ignore[return-value]


def _by_extension(group: KeyGroup) -> dict[str, TarEntry]:
    members: dict[str, TarEntry] = {}
    for entry in group.members:
        if entry.extension in members:
            raise BadRecord(f"two members with the extension {entry.extension!r}")
        members[entry.extension] = entry
    return members


def _member_resolver(shard: TarShard, path: str, members: dict[str, TarEntry]) -> MediaResolver:
    """Media named by the extension of a member of the sample (``1.jpg``), read from the shard."""

    def member_media(kind: MediaKind, value: object, _where: str) -> MediaRef:
        if not isinstance(value, str):
            raise BadRecord(f"is {type(value).__name__}, not the extension of a member of the key")
        entry = members.get(value.lower())
        if entry is None or media_kind(entry.extension) != kind:
            raise BadRecord(f"names {value!r}, but the key has no {kind} member of that extension")
        return MediaRef(kind, location(path, key=entry.name), data=shard.read(entry))

    return member_media


def _json_member(shard: TarShard, members: dict[str, TarEntry]) -> dict[str, object] | None:
    entry = members.get("json")
    if entry is None:
        return None
    try:
        described = json.loads(shard.read(entry))
    except ValueError as exc:
        raise BadRecord(f"unparsable .json: {exc}") from None
    if not isinstance(described, dict):
        raise BadRecord(f".json holds a {type(described).__name__}, not an object")
    return described


def _text_member(shard: TarShard, entry: TarEntry) -> str:
    try:
        return shard.read(entry).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRecord(f".{entry.extension} is not UTF-8: byte {exc.start}") from None
