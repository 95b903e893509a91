"""The source file formats mixflow reads: the one list that the spec's ``reader`` field, its defaults and
checks (``pipeline.spec.sources``) and the readers' table (``connectors.readers``) are made from.

A new format is a line here and a ``Reader`` subclass in ``connectors/readers/`` that names it."""

from __future__ import annotations

from dataclasses import dataclass

COMPRESSED_EXTENSIONS: dict[str, str] = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
"""The compressions the line-based readers (JSONL, text) decode, by the extension after the format's own
(``connectors.compression`` decodes them)."""


@dataclass(frozen=True)
class FileFormat:
    """``name`` as a spec's ``reader`` gives it; ``default_glob`` picks a source's files when its spec gives
    no glob; ``fields``: its records have named columns or keys (a spec's ``field`` picks one); ``text``: it
    reads text (or token) sources; ``media``: it reads multimodal sources."""

    name: str
    default_glob: str
    fields: bool
    text: bool = True
    media: bool = False


FILE_FORMATS: dict[str, FileFormat] = {
    f.name: f
    for f in (
        FileFormat("jsonl", "**/*.jsonl", fields=True, media=True),
        FileFormat("parquet", "**/*.parquet", fields=True, media=True),
        FileFormat("arrow", "**/*.arrow", fields=True, media=True),
        FileFormat("text", "**/*.txt", fields=False),
        FileFormat("webdataset", "**/*.tar", fields=False, text=False, media=True),
    )
}
