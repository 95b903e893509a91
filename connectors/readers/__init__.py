"""Readers for source files, one class per format, and a table to pick one by name."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

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

ReaderFormat = Literal["jsonl", "parquet", "arrow", "text"]
READERS: dict[str, type[Reader]] = {
    "jsonl": JsonlReader,
    "parquet": ParquetReader,
    "arrow": ArrowReader,
    "text": TextReader,
}


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
