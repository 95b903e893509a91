"""Readers for source files, one class per format of ``topics.file_formats``, and a table to pick one by name."""

from __future__ import annotations

from pathlib import Path

from connectors.readers.arrow_ipc import ArrowReader
from connectors.readers.base import (
    ContentKind,
    Document,
    FileLayout,
    Reader,
    SourceNotFoundError,
    location,
)
from connectors.readers.jsonl import JsonlReader
from connectors.readers.parquet import ParquetReader
from connectors.readers.text import TextReader
from topics.file_formats import FILE_FORMATS

ReaderFormat = str
"""A name of ``topics.file_formats.FILE_FORMATS``."""
READERS: dict[str, type[Reader]] = {
    reader.file_format.name: reader for reader in (JsonlReader, ParquetReader, ArrowReader, TextReader)
}
if missing := FILE_FORMATS.keys() - READERS.keys():
    raise ImportError(f"no reader for the file formats {sorted(missing)} of topics.file_formats")


def make_reader(
    file_format: ReaderFormat,
    source: str,
    root: str | Path,
    glob: str | None = None,
    field: str = "text",
    *,
    content: ContentKind = "text",
) -> Reader:
    """The reader for ``file_format``; ``ValueError`` naming the known formats otherwise."""
    try:
        reader_class = READERS[file_format]
    except KeyError as exc:
        msg = f"source {source}: format {file_format!r} is not one of {', '.join(READERS)}"
        raise ValueError(msg) from exc
    return reader_class(source, root, glob, field, content=content)


__all__ = [
    "READERS",
    "ArrowReader",
    "ContentKind",
    "Document",
    "FileLayout",
    "JsonlReader",
    "ParquetReader",
    "Reader",
    "ReaderFormat",
    "SourceNotFoundError",
    "TextReader",
    "location",
    "make_reader",
]
