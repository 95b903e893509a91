"""The source file formats mixflow reads: the one list that the spec's ``reader`` field, its defaults and
checks (``pipeline.spec.sources``) and the readers' table (``connectors.readers``) are made from.

A new format is a line here and a ``Reader`` subclass in ``connectors/readers/`` that names it."""

from __future__ import annotations

import re
from dataclasses import dataclass

COMPRESSED_EXTENSIONS: dict[str, str] = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
"""The compressions the line-based readers (JSONL, text) decode, by the extension after the format's own; the
default globs of those formats take them too (``connectors.compression`` decodes them)."""


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


def any_compression(extension: str) -> str:
    """The glob of every file ending in ``.extension``, compressed or not: ``**/*.{jsonl,jsonl.gz,...}``."""
    return "**/*.{" + ",".join([extension, *(extension + suffix for suffix in COMPRESSED_EXTENSIONS)]) + "}"


FILE_FORMATS: dict[str, FileFormat] = {
    f.name: f
    for f in (
        FileFormat("jsonl", any_compression("jsonl"), fields=True, media=True),
        FileFormat("parquet", "**/*.parquet", fields=True, media=True),
        FileFormat("arrow", "**/*.arrow", fields=True, media=True),
        FileFormat("text", any_compression("txt"), fields=False),
        FileFormat("webdataset", "**/*.tar", fields=False, text=False, media=True),
    )
}

_BRACES = re.compile(r"\{([^{}]*,[^{}]*)\}")  # an innermost {a,b,...} with a comma


def glob_alternatives(pattern: str) -> list[str]:
    """``pattern`` with each ``{a,b,...}`` expanded as a shell expands it, in order and without repeats:
    ``**/*.{jsonl,jsonl.gz}`` is ``**/*.jsonl`` and ``**/*.jsonl.gz``. A pattern without one is itself."""
    match = _BRACES.search(pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    expanded = [each for option in match.group(1).split(",") for each in glob_alternatives(head + option + tail)]
    return list(dict.fromkeys(expanded))
