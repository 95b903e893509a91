"""Compressed source files (gzip, zstd): which compression a file has, decoding its frames from any of them, and
the index of its frames that planning splits it by."""

from connectors.compression.codecs import (
    CODECS,
    CONTENT_ENCODINGS,
    EXTENSIONS,
    FRAME_NOUNS,
    Codec,
    CompressedDataError,
    codec_of,
)
from connectors.compression.frames import FrameIndex
from connectors.compression.stream import decode_frames, decoded, skipped

__all__ = [
    "CODECS",
    "CONTENT_ENCODINGS",
    "EXTENSIONS",
    "FRAME_NOUNS",
    "Codec",
    "CompressedDataError",
    "FrameIndex",
    "codec_of",
    "decode_frames",
    "decoded",
    "skipped",
]
