"""Arrow IPC files (also Feather v2), or the IPC stream format; the row is the 0-based row number."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.readers._columns import column_documents, is_text_type, is_token_type, media_columns, media_documents
from connectors.readers.base import Document, FileLayout, Reader, location
from connectors.work_units import WorkUnit
from topics.formats.dead_letter import DeadLetter
from topics.formats.file_formats import FILE_FORMATS


def read_ipc(full: Path | BinaryIO) -> pa.Table:
    """The whole table, memory-mapped (or from an object's file): the IPC file format when it has a footer,
    else the stream format."""
    with pa.memory_map(str(full)) if isinstance(full, Path) else pa.PythonFile(full, mode="r") as source:
        try:
            return pa.ipc.open_file(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_stream(source).read_all()


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
            table = read_ipc(self.full_path(path) if not self.storage.remote else self.open_file(path))
        except (OSError, pa.ArrowException) as exc:
            return FileLayout.unreadable(path, 0, f"cannot open as Arrow IPC: {exc}")
        if self.content == "media":
            media = table.select([n for n in table.column_names if n in set(self.media_fields.names)])
            sizes = np.full(table.num_rows, media.nbytes / max(table.num_rows, 1))
        elif self.field in table.column_names:
            sizes = row_sizes(table.column(self.field))
        else:
            sizes = np.full(table.num_rows, table.nbytes / max(table.num_rows, 1))
        row_bounds = np.concatenate([[0], np.rint(np.cumsum(sizes))]).astype(np.int64)
        return FileLayout(path, size, row_bounds)

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
        else only the batches that hold its rows."""
        if not self.storage.remote:
            table = read_ipc(self.full_path(unit.path))
            return table, 0, table.num_rows
        file = self.open_file(unit.path, unit, buffer_bytes=1 << 16)
        if unit.kind == "file":
            table = read_ipc(file)
            return table, 0, table.num_rows
        table, seen = read_ipc_rows(file, unit.start, unit.stop)
        return table, unit.start, seen
