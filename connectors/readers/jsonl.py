"""JSON Lines: one JSON object per line; the row is the 0-based line number."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from connectors.readers.base import Document, FileLayout, Reader, location
from connectors.readers.media_parts import media_document
from connectors.work_units import WorkUnit
from topics.formats.dead_letter import DeadLetter
from topics.formats.file_formats import FILE_FORMATS

_SCAN_BYTES = 8 << 20
# An object in a store of at most this many bytes is planned from the listing alone, as one unit: its lines
# are found when it is read. (A local file's layout is always read.)
LISTING_ONLY_BYTES = 1 << 20


def line_bounds(data: bytes, base: int) -> np.ndarray:
    """Offsets just past each b'\\n' in ``data``, shifted by ``base``."""
    return np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == ord("\n")).astype(np.int64) + base + 1


def lines(file: BinaryIO, chunk_bytes: int) -> Iterator[bytes]:
    """The lines from the file's position, each with its b"\\n" (the last may lack it), as ``readline`` gives
    them, read ``chunk_bytes`` at a time: one request per chunk from an object store."""
    rest = b""
    while data := file.read(chunk_bytes):
        pieces = (rest + data).split(b"\n")
        rest = pieces.pop()
        for piece in pieces:
            yield piece + b"\n"
    if rest:
        yield rest


class JsonlReader(Reader):
    """Each line holds an object whose ``field`` is the text (or, with ``content="tokens"``, a list of
    token ids). Blank lines are rows without a document; they are skipped silently.

    With ``content="media"`` each object is a pair or an interleaved document (``media_parts``) whose
    images and clips are files named relative to the source root: ``{"image": "imgs/1.jpg", "text": ...}``,
    ``{"images": [...], ...}``, ``{"video": "c.mp4", ...}``, ``{"segments": [{"text": ...}, {"image": ...}]}``.
    A path that leaves the root is a dead letter; whether the file exists is the decoder's to find out."""

    file_format = FILE_FORMATS["jsonl"]
    supported_content = ("text", "tokens", "media")

    def layout(self, path: str) -> FileLayout:
        parts = [np.zeros(1, dtype=np.int64)]
        size = 0
        try:
            with self.open_file(path, buffer_bytes=_SCAN_BYTES) as f:
                while data := f.read(_SCAN_BYTES):
                    parts.append(line_bounds(data, size))
                    size += len(data)
                    last = data[-1:]
        except OSError as exc:
            return FileLayout.unreadable(path, 0, f"cannot read: {exc}")
        if size and last != b"\n":
            parts.append(np.array([size], dtype=np.int64))
        return FileLayout(path, size, np.concatenate(parts))

    def object_layout(self, path: str) -> FileLayout:
        info = self.object_info(path)
        if info.size > LISTING_ONLY_BYTES:
            return super().object_layout(path)
        bounds = np.array([0, info.size] if info.size else [0], dtype=np.int64)  # an empty object has no rows
        return FileLayout(path, info.size, bounds, etag=info.etag, rows_known=False)

    def read(self, unit: WorkUnit) -> Iterator[Document | DeadLetter]:
        self.check_unit(unit)
        whole = unit.kind == "file"
        start = 0 if whole else unit.start
        # a unit's bytes are read ahead in one range where they fit the buffer: rows [start, stop) span exactly
        # estimated_bytes from byte_offset in a line-based file
        span = unit.object_size if whole else unit.estimated_bytes
        ahead = min(_SCAN_BYTES, span + 1) if span else _SCAN_BYTES
        row = start
        try:
            with self.open_file(unit.path, unit, buffer_bytes=ahead) as f:
                if not whole and unit.byte_offset:
                    f.seek(unit.byte_offset)
                else:
                    for _ in range(start):
                        f.readline()
                unit_lines = lines(f, ahead)
                while whole or row < unit.stop:  # checked first: a line past the unit would read another chunk
                    line = next(unit_lines, b"")
                    if not line:
                        break
                    if line.strip():
                        yield self._parse(unit.path, row, line)
                    row += 1
        except OSError as exc:  # the rows from ``row`` on are not read
            yield self.unit_letter(unit, location(unit.path), f"cannot read: {exc}", first=row)
            return
        if not whole and row < unit.stop:
            where = location(unit.path, row=row)
            reason = f"file ends at row {row}, before row {unit.stop} of {unit.unit_id}"
            yield self.unit_letter(unit, where, reason, first=row)

    def unit_rows_known(self, unit: WorkUnit) -> bool:
        """Not for a small object planned from its listing alone (``object_layout``): one "row" stands for the
        whole object, whose lines nobody counted."""
        listed_only = unit.kind == "file" and bool(unit.etag) and unit.object_size <= LISTING_ONLY_BYTES
        return super().unit_rows_known(unit) and not listed_only

    def _parse(self, path: str, row: int, line: bytes) -> Document | DeadLetter:
        where = location(path, row=row)
        try:
            record = json.loads(line)
        except ValueError as exc:
            return self.dead_letter(where, f"invalid JSON: {exc}", payload=line)
        if not isinstance(record, dict):
            return self.dead_letter(where, f"line is a JSON {type(record).__name__}, not an object", line)
        if self.content == "media":
            result = media_document(self, path, row, record)
        else:
            result = self.document(path, row, record.get(self.field))
        if isinstance(result, DeadLetter):
            return self.dead_letter(result.location, result.reason, payload=line)
        return result
