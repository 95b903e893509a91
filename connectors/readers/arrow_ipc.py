"""Arrow IPC files (also Feather v2), or the IPC stream format; the row is the 0-based row number."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.readers._columns import column_documents, is_text_type, is_token_type, media_columns, media_documents
from connectors.readers.base import Document, FileLayout, Reader, location
from connectors.work_units import WorkUnit
from topics.dead_letter import DeadLetter
from topics.file_formats import FILE_FORMATS


def read_ipc(full: Path) -> pa.Table:
    """The whole table, memory-mapped: the IPC file format when it has a footer, else the stream format."""
    with pa.memory_map(str(full)) as source:
        try:
            return pa.ipc.open_file(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_stream(source).read_all()


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
        full = self.full_path(path)
        try:
            size = full.stat().st_size
            table = read_ipc(full)
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
            table = read_ipc(self.full_path(unit.path))
        except (OSError, pa.ArrowException) as exc:
            yield self.dead_letter(where, f"cannot open as Arrow IPC: {exc}")
            return
        if self.content == "media":
            yield from self._media_rows(unit, table)
            return
        if self.field not in table.column_names:
            yield self.dead_letter(where, f"no column {self.field!r} (columns: {', '.join(table.column_names)})")
            return
        column = table.column(self.field)
        if unit.kind == "file":
            yield from column_documents(self, unit.path, 0, column, where)
            return
        yield from column_documents(self, unit.path, unit.start, column.slice(unit.start, unit.num_rows), where)
        yield from self._rows_missing(unit, table)

    def _rows_missing(self, unit: WorkUnit, table: pa.Table) -> Iterator[DeadLetter]:
        if table.num_rows < unit.stop:
            reason = f"file has {table.num_rows} rows, fewer than the {unit.stop} of {unit.unit_id}"
            yield self.dead_letter(location(unit.path, row=table.num_rows), reason)

    def _media_rows(self, unit: WorkUnit, table: pa.Table) -> Iterator[Document | DeadLetter]:
        columns = media_columns(self.media_fields, table.column_names)
        if isinstance(columns, str):
            yield self.dead_letter(location(unit.path), f"{columns} (columns: {', '.join(table.column_names)})")
            return
        media = table.select(columns)
        if unit.kind == "file":
            yield from media_documents(self, unit.path, 0, media)
            return
        yield from media_documents(self, unit.path, unit.start, media.slice(unit.start, unit.num_rows))
        yield from self._rows_missing(unit, table)
