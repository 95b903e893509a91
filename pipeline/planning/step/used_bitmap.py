"""A compact form of a source's used offsets in the state record, for when they are many.

Composition takes samples out of order, so the offsets delivered above a source's low watermark can be
thousands, scattered (at 256 ranks of 2 x 8192 tokens about 9,500 of them in 7,800 runs over a span of
54,000 offsets: 60 KB as a JSON list). Above ``BITMAP_ABOVE_BYTES`` of list, the state record holds them as
``"bits:<base64>"``: bit ``i`` (little-endian within each byte) set when offset ``low + i`` is used, so the
size is bounded by the span (``span / 6`` bytes), not by how scattered the offsets are. Shorter lists,
which are all of a small job's (the example's state records are a few hundred bytes), keep the list form
byte for byte."""

from __future__ import annotations

import base64
import binascii
import json

import numpy as np

BITMAP_ABOVE_BYTES = 4096
"""A source's used offsets as a list longer than this (in JSON bytes) are written as a bitmap if shorter."""
PREFIX = "bits:"


def pack(low: int, used: tuple[int, ...]) -> str:
    """``used`` (sorted, each >= ``low``) as ``"bits:<base64>"`` over ``low .. used[-1]``."""
    bits = np.zeros(used[-1] - low + 1 if used else 0, dtype=np.uint8)
    bits[np.asarray(used, dtype=np.int64) - low] = 1
    return PREFIX + base64.b64encode(np.packbits(bits, bitorder="little").tobytes()).decode("ascii")


def unpack(low: int, text: str) -> tuple[int, ...]:
    """The offsets ``pack`` wrote; ``ValueError`` saying what is wrong otherwise."""
    if not text.startswith(PREFIX):
        msg = f"used offsets must be a list or {PREFIX!r} and base64, got {text[:20]!r}"
        raise ValueError(msg)
    try:
        raw = base64.b64decode(text[len(PREFIX) :], validate=True)
    except (binascii.Error, ValueError) as exc:
        msg = f"used offsets {text[:20]!r}...: not base64 ({exc})"
        raise ValueError(msg) from exc
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little")
    return tuple((np.flatnonzero(bits) + low).tolist())


def encode_used(low: int, used: tuple[int, ...], as_list: list[int | list[int]]) -> list[int | list[int]] | str:
    """What the state record holds for ``used``: ``as_list`` (its list form), or the bitmap where that
    list is over ``BITMAP_ABOVE_BYTES`` and the bitmap is shorter."""
    if len(as_list) * 44 <= BITMAP_ABOVE_BYTES:  # an item takes at most 44 bytes: short enough for sure
        return as_list
    listed = len(json.dumps(as_list, separators=(",", ":")))
    if listed <= BITMAP_ABOVE_BYTES:
        return as_list
    packed = pack(low, used)
    return packed if len(packed) + 2 < listed else as_list  # + 2: the quotes
