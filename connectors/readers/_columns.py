"""Turning an Arrow column (from Parquet or Arrow IPC), or a table of multimodal columns, into documents,
shared by both readers."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from connectors.readers.base import INT32_LIMIT, Document, MediaFields, Reader, location
from connectors.readers.media_parts import media_document
from topics.formats.dead_letter import DeadLetter


def is_text_type(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def is_token_type(kind: pa.DataType) -> bool:
    return (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_integer(kind.value_type)


def column_documents(
    reader: Reader, path: str, first_row: int, column: pa.ChunkedArray, block: str
) -> Iterator[Document | DeadLetter]:
    """The documents of ``column``, whose first value is row ``first_row`` of ``path``; ``block`` names
    where the column came from, for a dead letter about the whole column."""
    kind = column.type
    if reader.content == "text" and is_text_type(kind):
        for offset, value in enumerate(column.to_pylist()):
            yield reader.document(path, first_row + offset, value)
    elif reader.content == "text" and (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
        for offset, value in enumerate(column.to_pylist()):
            yield _decoded(reader, path, first_row + offset, value)
    elif reader.content == "tokens" and is_token_type(kind):
        row = first_row
        for chunk in column.chunks:
            yield from _token_chunk(reader, path, row, chunk)
            row += len(chunk)
    else:
        expected = "a string column" if reader.content == "text" else "a list<int> column"
        reason = f"column {reader.field!r} has type {kind}, expected {expected}"
        yield DeadLetter(reader.source, block, reason, records=max(len(column), 1))  # every row of the column


def _decoded(reader: Reader, path: str, row: int, value: bytes | None) -> Document | DeadLetter:
    if value is None:
        return reader.document(path, row, None)
    try:
        return reader.document(path, row, value.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return reader.dead_letter(location(path, row=row), f"not UTF-8: {exc}", payload=value)


def _token_chunk(reader: Reader, path: str, first_row: int, chunk: pa.Array) -> Iterator[Document | DeadLetter]:
    if chunk.values.null_count:
        for offset, value in enumerate(chunk.to_pylist()):
            yield reader.document(path, first_row + offset, value)
        return
    offsets = chunk.offsets.to_numpy()
    values = chunk.values.to_numpy()
    nulls = chunk.is_null().to_numpy(zero_copy_only=False)
    bad = np.zeros(len(chunk), dtype=bool)
    out_of_range = np.flatnonzero((values < 0) | (values >= INT32_LIMIT))
    if len(out_of_range):
        # offsets[i] <= value index < offsets[i + 1] for the row i that holds it
        rows = np.searchsorted(offsets, out_of_range, side="right") - 1
        bad[rows[(rows >= 0) & (rows < len(chunk))]] = True
    tokens = values.astype(np.int32, copy=False)
    for offset in range(len(chunk)):
        row = first_row + offset
        if nulls[offset]:
            yield reader.document(path, row, None)
        elif bad[offset]:
            yield reader.dead_letter(location(path, row=row), "token ids outside [0, 2**31)")
        else:
            yield Document(reader.source, path, row, tokens=tokens[offsets[offset] : offsets[offset + 1]])


_MEDIA_BATCH_ROWS = 256


def media_columns(fields: MediaFields, names: list[str]) -> list[str] | str:
    """The columns of ``names`` that ``fields`` names, in the table's order; or, when they make no document
    (no segments, conversations or texts column, and no text column or no image or video column), the reason."""
    present = set(names)
    if not present & {*fields.segments, *fields.conversations, *fields.texts}:
        wanted = (("text", fields.text), ("image or video", (*fields.image, *fields.video)))
        for what, options in wanted:
            if not present & set(options):
                segments = ", ".join(fields.segments)
                return f"no {what} column ({', '.join(options)}) and no segments column ({segments})"
    return [n for n in names if n in set(fields.names)]


def media_documents(reader: Reader, path: str, first_row: int, table: pa.Table) -> Iterator[Document | DeadLetter]:
    """A document of parts for each row of ``table`` (its columns named by ``reader.media_fields``), whose
    first row is row ``first_row`` of ``path``."""
    row = first_row
    for batch in table.to_batches(max_chunksize=_MEDIA_BATCH_ROWS):
        for record in batch.to_pylist():
            yield media_document(reader, path, row, record)
            row += 1
