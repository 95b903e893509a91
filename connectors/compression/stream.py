"""Decoding the frames of a compressed file in order, from any frame's first byte: what a reader's unit reads,
and what planning scans to find the frames and the lines in them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from connectors.compression.codecs import FRAME_NOUNS, Codec, CompressedDataError, frame_decoders

FEED_BYTES = 1 << 16
"""Compressed bytes given to a decoder at a time: what one call returns stays within what they expand to."""


def decode_frames(
    read: Callable[[int], bytes], codec: Codec, offset: int = 0, chunk_bytes: int = 1 << 20
) -> Iterator[tuple[int, bytes]]:
    """The decompressed bytes of the frames that ``read(chunk_bytes)`` gives, from the first byte of a frame at
    compressed byte ``offset`` to the end of the data: each piece as ``(offset of its frame, bytes)``, and each
    frame first as ``(its offset, b"")``. Bytes that do not decode, or a frame the data ends in, raise
    ``CompressedDataError`` naming the frame, once every byte before them was given."""
    new_decoder, errors = frame_decoders(codec)
    noun = FRAME_NOUNS[codec]
    chunk, at = memoryview(b""), 0
    position = offset  # the compressed offset of chunk[at]
    while True:
        if at == len(chunk):
            chunk, at = memoryview(read(chunk_bytes)), 0
            if not chunk:
                return
        frame = position
        yield frame, b""
        decoder = new_decoder()
        while not decoder.eof:
            if at == len(chunk):
                chunk, at = memoryview(read(chunk_bytes)), 0
                if not chunk:
                    msg = f"{noun} at byte {frame} is cut short: the data ends at byte {position}"
                    raise CompressedDataError(msg)
            piece = chunk[at : at + FEED_BYTES]
            try:
                data = decoder.decompress(piece)
            except errors as exc:
                msg = f"{noun} at byte {frame} does not decode: {exc}"
                raise CompressedDataError(msg) from exc
            used = len(piece) - len(decoder.unused_data) if decoder.eof else len(piece)
            at += used
            position += used
            if data:
                yield frame, data


def decoded(
    read: Callable[[int], bytes], codec: Codec, offset: int = 0, skip: int = 0, chunk_bytes: int = 1 << 20
) -> Iterator[bytes]:
    """The decompressed bytes from the frame at compressed byte ``offset`` on, less their first ``skip``."""
    return skipped((data for _, data in decode_frames(read, codec, offset, chunk_bytes) if data), skip)


def skipped(chunks: Iterable[bytes], count: int) -> Iterator[bytes]:
    """``chunks`` without their first ``count`` bytes."""
    for chunk in chunks:
        if count >= len(chunk):
            count -= len(chunk)
            continue
        yield chunk[count:] if count else chunk
        count = 0
