"""The compressions a source file may have, gzip and zstd: which one a file has, and a decoder of one of its frames.

A file is compressed when its name ends in ``.gz``, ``.zst`` or ``.zstd``, or (an object in a bucket) when the
store gives it ``Content-Encoding: gzip`` (or ``zstd``). Its bytes are then one or more frames, each decoded on
its own: gzip members (``cat a.gz b.gz``, bgzip, pigz ``--independent`` write several) or zstd frames (``pzstd``,
the seekable-zstd format; its seek table is a skippable frame, which decodes to nothing)."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Literal, Protocol, cast, get_args

from topics.formats.file_formats import COMPRESSED_EXTENSIONS

Codec = Literal["gzip", "zstd"]
CODECS: tuple[str, ...] = get_args(Codec)
EXTENSIONS: dict[str, Codec] = cast(dict[str, Codec], COMPRESSED_EXTENSIONS)
# Content-Encoding values that say an object's bytes are compressed (RFC 9110; zstd: RFC 8878). Any other value
# (identity, or a charset set there by mistake) leaves the bytes as they are.
CONTENT_ENCODINGS: dict[str, Codec] = {"gzip": "gzip", "x-gzip": "gzip", "zstd": "zstd"}
FRAME_NOUNS: dict[Codec, str] = {"gzip": "gzip member", "zstd": "zstd frame"}
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer around the deflate stream, its CRC checked


class CompressedDataError(OSError):
    """Bytes of a compressed file that do not decode, or a frame cut short; the message names the frame (gzip
    member or zstd frame) by the byte offset where it begins. A reader makes it a dead letter for the rows it
    could not read, after the rows before it."""


class FrameDecoder(Protocol):
    """One frame's decoder, as ``zlib.decompressobj`` and ``zstandard``'s ``decompressobj`` are: ``eof`` once the
    frame ended, with the bytes given after its end in ``unused_data``."""

    @property
    def eof(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...

    def decompress(self, data: bytes | memoryview, /) -> bytes: ...


def codec_of(path: str, content_encoding: str = "") -> Codec | None:
    """The compression of ``path`` by its extension, or else by its object's ``Content-Encoding``; ``None``."""
    suffix = PurePosixPath(path).suffix.lower()
    if suffix in EXTENSIONS:
        return EXTENSIONS[suffix]
    return CONTENT_ENCODINGS.get(content_encoding.strip().lower())


def frame_decoders(codec: Codec) -> tuple[Callable[[], FrameDecoder], tuple[type[Exception], ...]]:
    """A maker of one-frame decoders for ``codec``, and the exceptions they raise for bytes that do not decode."""
    if codec == "gzip":
        return (lambda: zlib.decompressobj(_GZIP_WBITS)), (zlib.error,)
    import zstandard

    decompressor = zstandard.ZstdDecompressor()  # one context, reused by each frame's decoder in turn
    return decompressor.decompressobj, (zstandard.ZstdError,)


if set(EXTENSIONS.values()) - set(CODECS):
    raise ImportError(f"topics.formats.file_formats names compressions without a decoder: {EXTENSIONS}")
