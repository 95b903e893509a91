"""Decoding the current sample schemas' records straight from their bytes, without fastavro.

``read_sample`` reads a record of ``sample.avsc`` or ``sample_media.avsc`` as ``schemaless_reader`` would,
several times faster: tokens are an int32 view of the record's bytes, and each media frame a ``memoryview``
of them, so a frame is copied once on its way to a batch (into the batch's Arrow column), not once more into
a ``bytes`` of its own. It answers None for anything it does not take as well-formed (a varint past the end,
an index outside an enum, an int outside int32, a media item whose fields disagree, trailing bytes): the
general reader (``sample_codec.decode_sample``) then decodes the record or refuses it with its reason.
"""

from __future__ import annotations

import numpy as np

from topics.formats.loss_spans import LOSS_SPANS_KEY, parse_loss_spans
from topics.formats.media import MEDIA_KINDS, PIXEL_ENCODINGS, MediaItem
from topics.formats.sample import Sample

_WIRE_TOKENS = np.dtype("<i4")
_WIRE_IS_NATIVE = np.little_endian  # "<i4" is the native int32: tokens are a view, no conversion
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_MEDIA_INTS = 8  # grid_t ... token_offset, in INT_FIELDS order


class _Malformed(Exception):
    """Anything the fast reader does not take; the general reader decides."""


def _varint(value: bytes, pos: int) -> tuple[int, int]:
    """Avro's zig-zag varint at ``pos``: (the long, the position after it). IndexError past the end;
    ValueError for more than 10 bytes."""
    byte = value[pos]
    pos += 1
    if byte < 0x80:  # one byte: ids and sources shorter than 64 bytes, every small int
        return (byte >> 1) ^ -(byte & 1), pos
    raw, shift = byte & 0x7F, 7
    while byte & 0x80:
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")
        byte = value[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        shift += 7
    return (raw >> 1) ^ -(raw & 1), pos


def _int(value: bytes, pos: int) -> tuple[int, int]:
    n, pos = _varint(value, pos)
    if not _INT32_MIN <= n <= _INT32_MAX:
        raise _Malformed
    return n, pos


def _span(value: bytes, pos: int) -> tuple[int, int]:
    """A ``bytes``/``string`` field at ``pos``: (its first byte, the position after it)."""
    n, pos = _varint(value, pos)
    if n < 0 or pos + n > len(value):
        raise _Malformed
    return pos, pos + n


def _string(value: bytes, pos: int) -> tuple[str, int]:
    start, pos = _span(value, pos)
    return value[start:pos].decode("utf-8"), pos


def _block(value: bytes, pos: int) -> tuple[int, int]:
    """An array or map block's count at ``pos`` (a negative count is followed by the block's size)."""
    count, pos = _varint(value, pos)
    if count < 0:
        count = -count
        _, pos = _varint(value, pos)
    return count, pos


def _enum(value: bytes, pos: int, symbols: tuple[str, ...]) -> tuple[str, int]:
    index, pos = _varint(value, pos)
    if not 0 <= index < len(symbols):
        raise _Malformed
    return symbols[index], pos


def _metadata(value: bytes, pos: int) -> tuple[dict[str, str], int]:
    branch, pos = _varint(value, pos)
    if branch == 0:
        return {}, pos
    if branch != 1:
        raise _Malformed
    metadata: dict[str, str] = {}
    count, pos = _block(value, pos)
    while count:
        for _ in range(count):
            key, pos = _string(value, pos)
            metadata[key], pos = _string(value, pos)
        count, pos = _block(value, pos)
    return metadata, pos


def _media_item(value: bytes, view: memoryview, pos: int, length: int) -> tuple[MediaItem, int]:
    kind, pos = _enum(value, pos, MEDIA_KINDS)
    ints = []
    for _ in range(_MEDIA_INTS):
        n, pos = _int(value, pos)
        ints.append(n)
    encoding, pos = _enum(value, pos, PIXEL_ENCODINGS)
    frames = []
    count, pos = _block(value, pos)
    while count:
        for _ in range(count):
            start, pos = _span(value, pos)
            frames.append(view[start:pos])
        count, pos = _block(value, pos)
    grid_t, grid_h, grid_w, merge_size, temporal_patch_size, height, width, token_offset = ints
    item = MediaItem(
        kind, grid_t, grid_h, grid_w, merge_size, temporal_patch_size, height, width, token_offset, encoding,
        tuple(frames),
    )  # fmt: skip
    try:
        item.check()
    except ValueError as exc:
        raise _Malformed from exc
    if item.token_offset + item.tokens > length:
        raise _Malformed
    return item, pos


def _media(value: bytes, pos: int, length: int) -> tuple[tuple[MediaItem, ...], int]:
    view = memoryview(value)
    items = []
    count, pos = _block(value, pos)
    while count:
        for _ in range(count):
            item, pos = _media_item(value, view, pos, length)
            items.append(item)
        count, pos = _block(value, pos)
    return tuple(items), pos


def read_sample(value: bytes, *, with_media: bool) -> Sample | None:
    """The sample in ``value``, a record of ``sample_media.avsc`` if ``with_media`` else of ``sample.avsc``;
    None where the general reader must decide (the module docstring)."""
    try:
        sample_id, pos = _string(value, 0)
        source, pos = _string(value, pos)
        tokens_at, pos = _span(value, pos)
        tokens_bytes = pos - tokens_at
        length, pos = _int(value, pos)
        if tokens_bytes != 4 * length:
            return None
        metadata, pos = _metadata(value, pos)
        media, pos = _media(value, pos, length) if with_media else ((), pos)
        if pos != len(value):
            return None
        if LOSS_SPANS_KEY in metadata:
            parse_loss_spans(metadata[LOSS_SPANS_KEY], length)
    except (IndexError, ValueError, _Malformed):  # UnicodeDecodeError is a ValueError
        return None
    tokens = np.frombuffer(value, dtype=_WIRE_TOKENS, count=length, offset=tokens_at)
    return Sample(sample_id, source, tokens if _WIRE_IS_NATIVE else tokens.astype(np.int32), metadata, media)
