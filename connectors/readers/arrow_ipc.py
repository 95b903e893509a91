"""Arrow IPC files (also Feather v2), or the IPC stream format; the row is the 0-based row number.

A file is planned from one pass over its messages, which notes where each record batch's message begins: units
start at a record batch, and a unit in an object store reads the schema and then its own batches from there
(a file with dictionary batches is read from its start instead, and may be cut at any row)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.readers._columns import column_documents, is_text_type, is_token_type, media_columns, media_documents
from connectors.readers.base import Document, FileLayout, Reader, location
from connectors.storage import StorageError
from connectors.work_units import WorkUnit
from topics.formats.dead_letter import DeadLetter
from topics.formats.file_formats import FILE_FORMATS

_SMALL_READ_AHEAD = 8 << 10


def read_ipc(full: Path | BinaryIO) -> pa.Table:
    """The whole table, memory-mapped (or from an object's file): the IPC file format when it has a footer,
    else the stream format."""
    with pa.memory_map(str(full)) if isinstance(full, Path) else pa.PythonFile(full, mode="r") as source:
        try:
            return pa.ipc.open_file(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_stream(source).read_all()


@dataclass(frozen=True, slots=True)
class IpcScan:
    """A whole IPC file read message by message: its table, and where each record batch's message begins with
    the rows before it (``batch_rows``: every batch's first row, then the row count); ``batch_offsets`` is None
    where a batch cannot be read on its own (the file has dictionary batches)."""

    table: pa.Table
    batch_offsets: np.ndarray | None
    batch_rows: np.ndarray


def scan_ipc(full: Path | BinaryIO) -> IpcScan:
    """``IpcScan`` of a file in the IPC file or stream format."""
    with pa.memory_map(str(full)) if isinstance(full, Path) else pa.PythonFile(full, mode="r") as source:
        schema = _read_schema(source)
        batches, offsets, addressable = [], [], True
        while True:
            offset = source.tell()
            try:
                message = pa.ipc.read_message(source)
            except EOFError:  # the end-of-stream marker (the file format's footer follows it)
                break
            if message.type != "record batch":
                addressable = False  # a dictionary batch: batches refer to dictionaries read before them
                break
            batches.append(pa.ipc.read_record_batch(message, schema))
            offsets.append(offset)
    if not addressable:
        table = read_ipc(full if isinstance(full, Path) else _rewound(full))
        return IpcScan(table, None, np.array([0, table.num_rows], np.int64))
    rows = np.concatenate([[0], np.cumsum([b.num_rows for b in batches], dtype=np.int64)]).astype(np.int64)
    return IpcScan(pa.Table.from_batches(batches, schema), np.array(offsets, np.int64), rows)


def read_ipc_batches(file: BinaryIO, offset: int, rows: int) -> tuple[pa.Table, int] | None:
    """Up to ``rows`` rows from the record batch whose message begins at ``offset``, reading the schema and
    then batches from there, with the rows read (fewer where the file ends first); None where no record batch
    begins at ``offset`` (a unit planned without batch offsets)."""
    with pa.PythonFile(file, mode="r") as source:
        schema = _read_schema(source)
        source.seek(offset)
        batches, seen = [], 0
        while seen < rows:
            try:
                message = pa.ipc.read_message(source)
            except EOFError:  # the end of the stream
                if not batches:
                    return None
                break
            except StorageError:
                raise
            except (OSError, pa.ArrowException):
                if batches:  # corrupt past the unit's first batch
                    raise
                return None  # no message begins at ``offset``
            if message.type != "record batch":
                return None
            batches.append(pa.ipc.read_record_batch(message, schema))
            seen += batches[-1].num_rows
        return pa.Table.from_batches(batches, schema).slice(0, rows), seen


_FILE_MAGIC = b"ARROW1"


def _read_schema(source: pa.NativeFile) -> pa.Schema:
    """The schema at the start of an IPC file or stream, ``source`` left after it."""
    source.seek(0)
    start = len(_FILE_MAGIC) + 2 if source.read(len(_FILE_MAGIC)) == _FILE_MAGIC else 0  # magic, 2 bytes padding
    source.seek(start)
    return pa.ipc.read_schema(pa.ipc.read_message(source))


def _rewound(file: BinaryIO) -> BinaryIO:
    file.seek(0)
    return file


def read_ipc_rows(file: BinaryIO, start: int, stop: int) -> tuple[pa.Table, int]:
    """Rows ``[start, stop)`` of an IPC file read batch by batch, those before ``start`` dropped as they come
    and none read after ``stop``, with the number of rows seen (to tell a file that is too short)."""
    with pa.PythonFile(file, mode="r") as source:
        try:
            batches: Iterator[pa.RecordBatch] | pa.ipc.RecordBatchStreamReader
            reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            source.seek(0)
            reader = pa.ipc.open_stream(source)
            batches = reader
        kept, first, schema = [], 0, reader.schema
        for batch in batches:
            last = first + batch.num_rows
            if last > start:
                kept.append(batch.slice(max(start - first, 0), max(min(stop, last) - max(start, first), 0)))
            first = last
            if first >= stop:
                break
        return pa.Table.from_batches(kept, schema), first


def row_sizes(column: pa.ChunkedArray) -> np.ndarray:
    """Bytes of each row's value: exact for strings and token lists, the column average otherwise."""
    if is_text_type(column.type):
        lengths = pc.binary_length(column)
    elif is_token_type(column.type):
        lengths = pc.multiply(pc.list_value_length(column), column.type.value_type.byte_width)
    else:
        return np.full(len(column), column.nbytes / max(len(column), 1))
    return pc.fill_null(lengths, 0).to_numpy().astype(np.int64)


class ArrowReader(Reader):
    """Reads one column, ``field``, of an Arrow IPC file; it can be split into any row ranges. With
    ``content="media"``, the columns ``media_fields`` names, as the Parquet reader reads them (the files
    ``datasets.Dataset.save_to_disk`` writes, with ``Image()`` columns, among them)."""

    file_format = FILE_FORMATS["arrow"]
    supported_content = ("text", "tokens", "media")

    def layout(self, path: str) -> FileLayout:
        try:
            size = self.size_of(path)
            scan = scan_ipc(self.full_path(path) if not self.storage.remote else self.open_file(path))
        except (OSError, pa.ArrowException) as exc:
            return FileLayout.unreadable(path, 0, f"cannot open as Arrow IPC: {exc}")
        table = scan.table
        if self.content == "media":
            media = table.select([n for n in table.column_names if n in set(self.media_fields.names)])
            sizes = np.full(table.num_rows, media.nbytes / max(table.num_rows, 1))
        elif self.field in table.column_names:
            sizes = row_sizes(table.column(self.field))
        else:
            sizes = np.full(table.num_rows, table.nbytes / max(table.num_rows, 1))
        row_bounds = np.concatenate([[0], np.rint(np.cumsum(sizes))]).astype(np.int64)
        if scan.batch_offsets is None:
            return FileLayout(path, size, row_bounds)
        return FileLayout(path, size, row_bounds, row_groups=scan.batch_rows, group_offsets=scan.batch_offsets)

    def read(self, unit: WorkUnit) -> Iterator[Document | DeadLetter]:
        self.check_unit(unit)
        where = location(unit.path)
        try:
            table, first, total = self._unit_table(unit)
        except (OSError, pa.ArrowException) as exc:
            yield self.unit_letter(unit, where, f"cannot open as Arrow IPC: {exc}")
            return
        if self.content == "media":
            columns = media_columns(self.media_fields, table.column_names)
            if isinstance(columns, str):
                yield self.unit_letter(unit, where, f"{columns} (columns: {', '.join(table.column_names)})")
                return
            table = table.select(columns)
        elif self.field not in table.column_names:
            reason = f"no column {self.field!r} (columns: {', '.join(table.column_names)})"
            yield self.unit_letter(unit, where, reason)
            return
        if unit.kind != "file":
            table = table.slice(unit.start - first, unit.num_rows)
        start = 0 if unit.kind == "file" else unit.start
        if self.content == "media":
            yield from media_documents(self, unit.path, start, table)
        else:
            yield from column_documents(self, unit.path, start, table.column(self.field), where)
        if unit.kind != "file" and total < unit.stop:
            reason = f"file has {total} rows, fewer than the {unit.stop} of {unit.unit_id}"
            yield self.unit_letter(unit, location(unit.path, row=total), reason, first=max(total, unit.start))

    def _unit_table(self, unit: WorkUnit) -> tuple[pa.Table, int, int]:
        """A table holding the unit's rows, the file row its first row is, and the rows the file has (as far
        as read): memory-mapped on a local disk; from an object store, the whole object for a ``file`` unit,
        else the schema and the unit's batches from the offset it was planned with (a unit planned without one:
        the batches up to its last row)."""
        if not self.storage.remote:
            table = read_ipc(self.full_path(unit.path))
            return table, 0, table.num_rows
        if unit.kind == "file":
            table = read_ipc(self.open_file(unit.path, unit, buffer_bytes=1 << 16))
            return table, 0, table.num_rows
        # A small read-ahead: the schema's message and each batch's metadata are read apart from its body.
        if unit.byte_offset:
            file = self.open_file(unit.path, unit, buffer_bytes=_SMALL_READ_AHEAD)
            if (batches := read_ipc_batches(file, unit.byte_offset, unit.num_rows)) is not None:
                return batches[0], unit.start, unit.start + batches[1]
        table, seen = read_ipc_rows(self.open_file(unit.path, unit, buffer_bytes=1 << 16), unit.start, unit.stop)
        return table, unit.start, seen
