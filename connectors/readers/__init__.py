"""Readers for source files, one class per format of ``topics.formats.file_formats``, and a table to pick one by name.

Each reader's module is imported on first use: a loader of Parquet files loads ``pyarrow.parquet`` and
not ``pyarrow.compute``, which only the Arrow reader needs."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

import lazy_loader

from connectors.readers.base import (
    ContentKind,
    Document,
    FileLayout,
    MediaFields,
    MediaRef,
    Part,
    Reader,
    SourceNotFoundError,
    location,
)
from connectors.storage import Storage
from topics.formats.file_formats import FILE_FORMATS

if TYPE_CHECKING:
    from connectors.readers.arrow_ipc import ArrowReader
    from connectors.readers.jsonl import JsonlReader
    from connectors.readers.parquet import ParquetReader
    from connectors.readers.text import TextReader
    from connectors.readers.webdataset_shards import WebDatasetReader

ReaderFormat = str
"""A name of ``topics.formats.file_formats.FILE_FORMATS``."""
# The reader class of each format, (module, class name), whose ``file_format`` names the format.
READERS: dict[str, tuple[str, str]] = {
    "jsonl": ("connectors.readers.jsonl", "JsonlReader"),
    "parquet": ("connectors.readers.parquet", "ParquetReader"),
    "arrow": ("connectors.readers.arrow_ipc", "ArrowReader"),
    "text": ("connectors.readers.text", "TextReader"),
    "webdataset": ("connectors.readers.webdataset_shards", "WebDatasetReader"),
}
if missing := FILE_FORMATS.keys() - READERS.keys():
    raise ImportError(f"no reader for the file formats {sorted(missing)} of topics.formats.file_formats")


def reader_class(file_format: str) -> type[Reader]:
    """The reader class of ``file_format``; ``KeyError`` when there is none."""
    module, name = READERS[file_format]
    return getattr(importlib.import_module(module), name)


def make_reader(
    file_format: ReaderFormat,
    source: str,
    root: str | Path,
    glob: str | None = None,
    field: str = "text",
    *,
    content: ContentKind = "text",
    media_fields: MediaFields | None = None,
    storage: Storage | None = None,
) -> Reader:
    """The reader for ``file_format``; ``ValueError`` naming the known formats otherwise. ``content="media"``
    reads text, images and clips (Parquet, JSONL, Arrow and WebDataset) from the keys or columns that
    ``media_fields`` names (default ``MediaFields()``). ``root`` may be ``s3://bucket/prefix``, read through
    ``storage`` (``connectors.storage.storage_for(root, settings)``)."""
    try:
        reader = reader_class(file_format)
    except KeyError as exc:
        msg = f"source {source}: format {file_format!r} is not one of {', '.join(READERS)}"
        raise ValueError(msg) from exc
    return reader(source, root, glob, field, content=content, media_fields=media_fields, storage=storage)


__getattr__, _, _ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "arrow_ipc": ["ArrowReader"],
        "jsonl": ["JsonlReader"],
        "parquet": ["ParquetReader"],
        "text": ["TextReader"],
        "webdataset_shards": ["WebDatasetReader"],
    },
)
__all__ = [
    "READERS",
    "ArrowReader",
    "ContentKind",
    "Document",
    "FileLayout",
    "JsonlReader",
    "MediaFields",
    "MediaRef",
    "ParquetReader",
    "Part",
    "Reader",
    "ReaderFormat",
    "SourceNotFoundError",
    "TextReader",
    "WebDatasetReader",
    "location",
    "make_reader",
    "reader_class",
]
