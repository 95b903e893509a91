"""Pillow's own decompression-bomb limit, raised to a source's ``max_decoded_pixels`` while its images open.

Pillow warns about an image of more than ``Image.MAX_IMAGE_PIXELS`` pixels (about 89 million) and refuses one
of more than twice that, before the caller sees its header, so a ``max_decoded_pixels`` above that would not
admit what it says. The limit is one setting for the whole process, so it is raised only inside
``pillow_pixel_limit`` blocks, to the largest bound any block in any thread needs, and put back when the last
block leaves; other threads' Pillow calls see the raised value while a block is open (never a lower one), and a
value other code sets meanwhile is kept as Pillow's own limit (unless it is the raised value itself)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from PIL import Image


class _Limit:
    """The blocks open in any thread and Pillow's limit as its other users set it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.needs: list[int] = []  # the bound of every open block
        self.own: int | None = Image.MAX_IMAGE_PIXELS  # what the last block leaving puts back
        self.written: int | None = self.own  # a different value found in Pillow was set by other code

    def apply(self) -> None:
        if self.written != Image.MAX_IMAGE_PIXELS:
            self.own = Image.MAX_IMAGE_PIXELS
        target = self.own if self.own is None or not self.needs else max(self.own, *self.needs)
        Image.MAX_IMAGE_PIXELS = self.written = target


_LIMIT = _Limit()


@contextmanager
def pillow_pixel_limit(pixels: int) -> Iterator[None]:
    """Inside the block Pillow neither warns about nor refuses an image of up to ``pixels`` pixels (its limit is
    at least ``pixels``, unless it has none); it is back to its own value once no block is open."""
    with _LIMIT.lock:
        _LIMIT.needs.append(pixels)
        _LIMIT.apply()
    try:
        yield
    finally:
        with _LIMIT.lock:
            _LIMIT.needs.remove(pixels)
            _LIMIT.apply()
