"""Parquet, read one row group at a time; the row is the 0-based row number within the file."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from connectors.readers._columns import column_documents, media_columns, media_documents
from connectors.readers.base import Document, FileLayout, Reader, location
from connectors.storage import ObjectChangedError, ObjectMissingError
from connectors.work_units import WorkUnit
from topics.formats.dead_letter import DeadLetter
from topics.formats.file_formats import FILE_FORMATS

# The tail of an object read for its footer in one request: a footer longer than this takes one more.
_FOOTER_GUESS_BYTES = 16 << 10
_MAGIC = b"PAR1"
# Footers of objects kept, by path and ETag, so the units of one object read its footer once.
_FOOTERS_KEPT = 64


class ParquetReader(Reader):
    """Reads one column, ``field``: strings, or lists of integer token ids with ``content="tokens"``.
    A file is split only at row group boundaries; a corrupt row group becomes one dead letter and the
    file's other row groups are still read.

    With ``content="media"`` it reads the columns ``media_fields`` names that the file has, each row a pair
    or an interleaved document (``media_parts``): a text column and an image column as Hugging Face
    ``datasets`` writes its ``Image()`` feature (``struct<bytes: binary, path: string>``; a list of them for
    several images), plain ``binary``, or ``string`` paths relative to the source root; likewise a video
    column; or a segments column, ``list<struct<text: string, image: struct<bytes, path>>>`` (and ``video``)."""

    file_format = FILE_FORMATS["parquet"]
    supported_content = ("text", "tokens", "media")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._footers: dict[tuple[str, str], pq.FileMetaData] = {}
        self._footers_lock = threading.Lock()

    def parquet_file(self, path: str, unit: WorkUnit | None = None) -> pq.ParquetFile:
        """The file, opened by path on a local disk; in an object store read by exact ranges (the footer, once
        for each version of an object this reader keeps, then the column chunks of the row groups read), at the
        version ``unit`` planned."""
        if not self.storage.remote:
            return pq.ParquetFile(self.full_path(path))
        file = self.open_file(path, unit, buffer_bytes=0)  # pyarrow asks for each column chunk whole
        version = (path, unit.etag if unit is not None else self.object_info(path).etag)
        metadata = self._footers.get(version) if version[1] else None
        parquet = pq.ParquetFile(file, metadata=metadata or read_footer(file))
        if version[1]:
            with self._footers_lock:  # planning reads layouts on several threads
                self._footers[version] = parquet.metadata
                while len(self._footers) > _FOOTERS_KEPT:
                    self._footers.pop(next(iter(self._footers)))
        return parquet

    def layout(self, path: str) -> FileLayout:
        try:
            size = self.size_of(path)
            meta = self.parquet_file(path).metadata
        except (OSError, pa.ArrowException) as exc:
            return FileLayout.unreadable(path, self._size_or_zero(path), f"cannot open as Parquet: {exc}")
        rows = np.array([meta.row_group(i).num_rows for i in range(meta.num_row_groups)], dtype=np.int64)
        group_bytes = np.array(
            [self._content_bytes(meta.row_group(i)) for i in range(meta.num_row_groups)], dtype=np.float64
        )
        # rows of a group are assumed equally large: the metadata gives sizes per group only
        per_row = np.repeat(group_bytes / np.maximum(rows, 1), rows)
        row_bounds = np.concatenate([[0], np.rint(np.cumsum(per_row))]).astype(np.int64)
        row_groups = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        return FileLayout(path, size, row_bounds, row_groups=row_groups)

    def _content_bytes(self, group: pq.RowGroupMetaData) -> int:
        names = set(self.media_fields.names) if self.content == "media" else {self.field}
        sizes = [
            group.column(j).total_uncompressed_size
            for j in range(group.num_columns)
            if group.column(j).path_in_schema.split(".")[0] in names
        ]
        return sum(sizes) if sizes else group.total_byte_size

    def read(self, unit: WorkUnit) -> Iterator[Document | DeadLetter]:
        self.check_unit(unit)
        try:
            parquet = self.parquet_file(unit.path, unit)
        except (OSError, pa.ArrowException) as exc:
            yield self.unit_letter(unit, location(unit.path), f"cannot open as Parquet: {exc}")
            return
        columns = self._columns(parquet.schema_arrow.names)
        if isinstance(columns, str):
            names = ", ".join(parquet.schema_arrow.names)
            yield self.unit_letter(unit, location(unit.path), f"{columns} (columns: {names})")
            return
        meta = parquet.metadata
        starts = np.concatenate([[0], np.cumsum([meta.row_group(i).num_rows for i in range(meta.num_row_groups)])])
        if unit.row_group is not None and unit.row_group >= meta.num_row_groups:
            reason = f"row group {unit.row_group} planned, but the file has {meta.num_row_groups}"
            yield self.unit_letter(unit, location(unit.path, row_group=unit.row_group), reason)
            return
        for group in self._groups(unit, starts):
            block = location(unit.path, row_group=group)
            # The unit's rows in this row group (a whole file's unit: all of them).
            lo, hi = int(starts[group]), int(starts[group + 1])
            if unit.kind == "rows":
                lo, hi = max(unit.start, lo), min(unit.stop, hi)
            try:
                table = parquet.read_row_group(group, columns=columns)
            except (ObjectChangedError, ObjectMissingError) as exc:  # the rest of the unit is refused with it
                yield self.unit_letter(unit, location(unit.path), f"cannot read: {exc}", first=lo)
                return
            except (OSError, pa.ArrowException) as exc:
                yield self.unit_letter(unit, block, f"cannot read row group: {exc}", first=lo, stop=hi)
                continue
            first = int(starts[group])
            if unit.kind == "rows":
                table, first = table.slice(lo - first, hi - lo), lo
            if self.content == "media":
                yield from media_documents(self, unit.path, first, table)
            else:
                yield from column_documents(self, unit.path, first, table.column(self.field), block)

    def _columns(self, names: list[str]) -> list[str] | str:
        """The columns to read, or why the file has none to read."""
        if self.content != "media":
            return [self.field] if self.field in names else f"no column {self.field!r}"
        return media_columns(self.media_fields, names)

    @staticmethod
    def _groups(unit: WorkUnit, starts: np.ndarray) -> range:
        if unit.kind == "row_group":
            return range(unit.row_group, unit.row_group + 1)
        if unit.kind == "file":
            return range(len(starts) - 1)
        first = int(np.searchsorted(starts, unit.start, side="right")) - 1
        last = int(np.searchsorted(starts, unit.stop, side="left"))
        return range(max(first, 0), min(last, len(starts) - 1))

    def _size_or_zero(self, path: str) -> int:
        try:
            return self.size_of(path)
        except OSError:
            return 0


def read_footer(file: BinaryIO) -> pq.FileMetaData:
    """The footer of the Parquet file ``file`` (seekable; an object read by ranges), from one read of its last
    ``_FOOTER_GUESS_BYTES`` and, where the footer is longer, one read of the rest: pyarrow's own footer read asks
    for the last 64 KiB, most of a small object."""
    size = file.seek(0, io.SEEK_END)
    file.seek(max(size - _FOOTER_GUESS_BYTES, 0))
    tail = file.read()
    if len(tail) < 8 or tail[-4:] != _MAGIC:
        msg = "Parquet magic bytes not found in footer. Either the file is corrupted or this is not a parquet file."
        raise pa.ArrowInvalid(msg)
    length = int.from_bytes(tail[-8:-4], "little")
    if length + 8 + len(_MAGIC) > size:
        msg = f"Parquet footer of {length} bytes does not fit a file of {size} bytes"
        raise pa.ArrowInvalid(msg)
    if length + 8 > len(tail):
        file.seek(size - 8 - length)
        tail = file.read(length - len(tail) + 8) + tail
    return pq.read_metadata(pa.BufferReader(_MAGIC + tail[-8 - length :]))
