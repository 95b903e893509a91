"""JSON Lines: one JSON object per line; the row is the 0-based line number."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from functools import partial
from typing import BinaryIO

import numpy as np

from connectors.compression import Codec, CompressedDataError, FrameIndex, decode_frames, decoded
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
    return chunk_lines(iter(partial(file.read, chunk_bytes), b""))


def chunk_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of the bytes ``chunks`` hold end to end, each with its b"\\n" (the last may lack it)."""
    rest = b""
    for data in chunks:
        pieces = (rest + data).split(b"\n")
        rest = pieces.pop()
        for piece in pieces:
            yield piece + b"\n"
    if rest:
        yield rest


def compressed_layout(path: str, file: BinaryIO, codec: Codec, stored_bytes: int) -> FileLayout:
    """The lines and frames of a compressed file, decoded from its first byte: ``row_bounds`` in its decompressed
    bytes. Bytes that do not decode end the scan: the rows before them are kept, and what follows the last whole
    line is one row more, whose reading gives the dead letter that says what and where."""
    parts = [np.zeros(1, dtype=np.int64)]
    offsets: list[int] = []
    starts: list[int] = []
    size = 0
    last = b"\n"
    try:
        for frame, data in decode_frames(file.read, codec, 0, _SCAN_BYTES):
            if not data:
                offsets.append(frame)
                starts.append(size)
                continue
            parts.append(line_bounds(data, size))
            size += len(data)
            last = data[-1:]
    except CompressedDataError:
        last = b""
    if last != b"\n":
        parts.append(np.array([size], dtype=np.int64))
    frames = FrameIndex(np.array(offsets, dtype=np.int64), np.array(starts, dtype=np.int64)) if offsets else None
    return FileLayout(path, stored_bytes, np.concatenate(parts), frames=frames)


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
                if (codec := self.codec(path, f)) is not None:
                    return compressed_layout(path, f, codec, self.size_of(path))
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
        # estimated_bytes from byte_offset in a line-based file (a compressed one's are fewer, as stored)
        span = unit.object_size if whole else unit.estimated_bytes
        ahead = min(_SCAN_BYTES, span + 1) if span else _SCAN_BYTES
        row = start
        try:
            with self.open_file(unit.path, unit, buffer_bytes=ahead) as f:
                unit_lines = self._unit_lines(unit, f, ahead)
                while whole or row < unit.stop:  # checked first: a line past the unit would read another chunk
                    line = next(unit_lines, b"")
                    if not line:
                        break
                    if line.strip():
                        yield self._parse(unit.path, row, line)
                    row += 1
        except CompressedDataError as exc:  # the rows from ``row`` on are not read; those before were
            yield self.unit_letter(unit, location(unit.path, row=row), f"cannot decompress: {exc}", first=row)
            return
        except OSError as exc:  # the rows from ``row`` on are not read
            yield self.unit_letter(unit, location(unit.path), f"cannot read: {exc}", first=row)
            return
        if not whole and row < unit.stop:
            where = location(unit.path, row=row)
            reason = f"file ends at row {row}, before row {unit.stop} of {unit.unit_id}"
            yield self.unit_letter(unit, where, reason, first=row)

    def _unit_lines(self, unit: WorkUnit, file: BinaryIO, chunk_bytes: int) -> Iterator[bytes]:
        """The lines of ``file`` from the unit's first row on: from its ``byte_offset`` (in a compressed file, the
        frame there, less ``skip_bytes``), or else from the file's start past ``unit.start`` lines."""
        positioned = unit.kind != "file" and bool(unit.byte_offset or unit.skip_bytes)
        if positioned:
            file.seek(unit.byte_offset)
        offset, skip = (unit.byte_offset, unit.skip_bytes) if positioned else (0, 0)
        codec = self.codec(unit.path, file)
        chunks: Iterable[bytes] = (
            iter(partial(file.read, chunk_bytes), b"")
            if codec is None
            else decoded(file.read, codec, offset, skip, chunk_bytes)
        )
        unit_lines = chunk_lines(chunks)
        if not positioned and unit.kind != "file":
            for _ in range(unit.start):
                next(unit_lines, b"")
        return unit_lines

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
