"""The sample id grammar, in one place.

    <source>/<path relative to the source root, '/' separators>/<row>[#<chunk>][@e<epoch>]

``#<chunk>`` appears only when a long document was split (chunks count from 0); ``@e<epoch>`` only
for epochs after the first (epoch 0 has no suffix). The source name holds no '/', so the first '/'
ends it; the row is the last segment, so a path may itself hold '/', '#' or '@'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TAIL = re.compile(r"(?P<row>0|[1-9][0-9]*)(?:#(?P<chunk>0|[1-9][0-9]*))?(?:@e(?P<epoch>[1-9][0-9]*))?")


@dataclass(frozen=True, slots=True)
class SampleId:
    """The parts of a sample id. ``chunk`` is None when the document was not split."""

    source: str
    path: str
    row: int
    chunk: int | None = None
    epoch: int = 0

    @property
    def base(self) -> str:
        """The id without chunk and epoch suffixes: the document's id."""
        return document_id(self.source, self.path, self.row)

    def __str__(self) -> str:
        return sample_id(self.source, self.path, self.row, chunk=self.chunk, epoch=self.epoch)


def document_id(source: str, path: str, row: int) -> str:
    """``<source>/<path>/<row>``: a document's id, without chunk or epoch suffix."""
    if not source or "/" in source:
        msg = f"source name {source!r} must be non-empty and hold no '/'"
        raise ValueError(msg)
    if not path or path.startswith("/") or path.endswith("/"):
        msg = f"path {path!r} must be relative to the source root, with '/' separators"
        raise ValueError(msg)
    if row < 0:
        msg = f"row {row} of {source}/{path} must be >= 0"
        raise ValueError(msg)
    return f"{source}/{path}/{row}"


def with_suffixes(document: str, *, chunk: int | None = None, epoch: int = 0) -> str:
    """Append ``#<chunk>`` (when split) and ``@e<epoch>`` (after the first epoch) to a document id."""
    if chunk is not None and chunk < 0:
        msg = f"chunk {chunk} of {document} must be >= 0"
        raise ValueError(msg)
    if epoch < 0:
        msg = f"epoch {epoch} of {document} must be >= 0"
        raise ValueError(msg)
    chunk_part = "" if chunk is None else f"#{chunk}"
    epoch_part = f"@e{epoch}" if epoch else ""
    return f"{document}{chunk_part}{epoch_part}"


def sample_id(source: str, path: str, row: int, *, chunk: int | None = None, epoch: int = 0) -> str:
    """Build a sample id from its parts."""
    return with_suffixes(document_id(source, path, row), chunk=chunk, epoch=epoch)


def parse_sample_id(text: str) -> SampleId:
    """Split a sample id into its parts; ``ValueError`` naming the id when it does not follow the grammar."""
    source, sep, rest = text.partition("/")
    path, sep2, tail = rest.rpartition("/")
    match = _TAIL.fullmatch(tail)
    if not (sep and sep2 and source and path and match):
        msg = f"sample id {text!r} does not match <source>/<path>/<row>[#<chunk>][@e<epoch>]"
        raise ValueError(msg)
    chunk = match["chunk"]
    epoch = match["epoch"]
    parsed = SampleId(
        source=source,
        path=path,
        row=int(match["row"]),
        chunk=None if chunk is None else int(chunk),
        epoch=0 if epoch is None else int(epoch),
    )
    try:
        document_id(parsed.source, parsed.path, parsed.row)
    except ValueError as exc:
        msg = f"sample id {text!r} is not valid: {exc}"
        raise ValueError(msg) from exc
    return parsed
