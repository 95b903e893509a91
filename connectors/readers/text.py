"""Plain text files: each file is one document, row 0."""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np

from connectors.compression import CompressedDataError, decoded
from connectors.readers.base import Document, FileLayout, Reader, location
from connectors.work_units import WorkUnit
from topics.formats.dead_letter import DeadLetter
from topics.formats.file_formats import FILE_FORMATS


class TextReader(Reader):
    """The whole file, decoded as UTF-8, is the document's text; ``field`` is not used, and ``content``
    must be ``"text"``. A file that is not valid UTF-8 becomes a dead letter naming the first bad byte.

    A compressed file (``.gz``, ``.zst``, ``.zstd``, or an object with ``Content-Encoding: gzip``) is decompressed
    first; one that does not decode is a dead letter naming the gzip member or zstd frame and its byte offset. Its
    layout is its size as stored: planning does not open it, so its unit is costed at its compressed bytes."""

    file_format = FILE_FORMATS["text"]
    supported_content = ("text",)

    def layout(self, path: str) -> FileLayout:
        try:
            size = self.size_of(path)
        except OSError as exc:
            return FileLayout.unreadable(path, 0, f"cannot stat: {exc}")
        return FileLayout(path, size, np.array([0, size], dtype=np.int64))

    def read(self, unit: WorkUnit) -> Iterator[Document | DeadLetter]:
        self.check_unit(unit)
        where = location(unit.path)
        try:
            with self.open_file(unit.path, unit, buffer_bytes=0) as file:
                data = file.read()
                codec = self.codec(unit.path, file)  # after the read: an object's encoding comes with its bytes
            if codec is not None:
                data = b"".join(decoded(io.BytesIO(data).read, codec))
        except CompressedDataError as exc:
            yield self.dead_letter(where, f"cannot decompress: {exc}")
            return
        except OSError as exc:
            yield self.dead_letter(where, f"cannot read: {exc}")
            return
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield self.dead_letter(where, f"not UTF-8: byte {exc.start} ({data[exc.start : exc.start + 1]!r})")
            return
        yield Document(self.source, unit.path, 0, text=text, where=where)
