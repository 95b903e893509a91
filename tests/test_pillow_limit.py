"""Pillow's decompression-bomb limit follows ``max_decoded_pixels`` while mixflow opens an image, in any number
of threads at once, and is back to its own value (or to what other code set meanwhile) once none is open."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from connectors.media.decode import MediaDecoder
from connectors.media.errors import MediaError
from connectors.media.pillow_limit import pillow_pixel_limit
from connectors.readers.base import MediaRef
from tests.media_support import VISION, image_bytes, text_image

WAIT_S = 10.0


def _ref(width: int, height: int) -> MediaRef:
    return MediaRef("image", "test:item", data=image_bytes(text_image(width, height)))


def test_an_image_over_pillows_limit_within_max_decoded_pixels_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pillow's limit lowered to 1,000 pixels stands for its real one (about 89 million): an image of 3,600
    pixels, over twice that, is one Pillow refuses on its own."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000)
    decoder = MediaDecoder(replace(VISION, max_decoded_pixels=4_000))
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        assert decoder.grid(_ref(60, 60)) == (1, 4, 4)
        assert decoder.decode(_ref(60, 60)).grid == (1, 4, 4)
        assert decoder.decode(_ref(50, 30)).grid == (1, 4, 6)  # 1,500 pixels: Pillow would warn
    assert Image.MAX_IMAGE_PIXELS == 1_000
    with warnings.catch_warnings(), pytest.raises(MediaError, match="80x60 = 4800 pixels, more than max_decoded"):
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # Pillow's, above its limit, before ours
        decoder.decode(_ref(80, 60))
    with pytest.raises(MediaError, match="too large to decode safely"):  # over twice the bound: Pillow refuses
        decoder.grid(_ref(100, 90))
    assert Image.MAX_IMAGE_PIXELS == 1_000


def test_a_lower_max_decoded_pixels_leaves_pillows_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000)
    with pillow_pixel_limit(500):
        assert Image.MAX_IMAGE_PIXELS == 1_000
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # no limit at all stays none
    with pillow_pixel_limit(500):
        assert Image.MAX_IMAGE_PIXELS is None
    assert Image.MAX_IMAGE_PIXELS is None


@st.composite
def schedules(draw: st.DrawFn) -> tuple[list[int], list[int], dict[int, int]]:
    """Bounds of blocks open at once in as many threads, the order they leave in, and values other code sets
    Pillow's limit to before the k-th leaves."""
    needs = draw(st.lists(st.integers(1, 10**9), min_size=1, max_size=6))
    order = draw(st.permutations(range(len(needs))))
    sets = draw(st.dictionaries(st.integers(0, len(needs) - 1), st.integers(1, 10**9), max_size=2))
    return needs, list(order), sets


@settings(max_examples=25, deadline=None)
@given(schedule=schedules(), own=st.integers(1, 10**9))
def test_blocks_in_threads_hold_the_largest_bound_and_put_back_pillows_own(
    schedule: tuple[list[int], list[int], dict[int, int]], own: int
) -> None:
    with _pillow_limit_set_to(own):
        _run_blocks(*schedule, own)


@contextmanager
def _pillow_limit_set_to(value: int | None) -> Iterator[None]:
    before = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = value
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = before


def _run_blocks(needs: list[int], order: list[int], sets: dict[int, int], own: int) -> None:
    """Threads open a block each (bound ``needs[k]``), all at once, and leave in ``order``; other code sets
    Pillow's limit to ``sets[step]`` before step ``step``. The limit is checked at every step."""
    inside = threading.Barrier(len(needs) + 1)
    leave = [threading.Event() for _ in needs]
    left = [threading.Event() for _ in needs]
    seen: list[int | None] = [None] * len(needs)

    def hold(k: int) -> None:
        with pillow_pixel_limit(needs[k]):
            seen[k] = Image.MAX_IMAGE_PIXELS
            inside.wait(WAIT_S)
            leave[k].wait(WAIT_S)
        left[k].set()

    threads = [threading.Thread(target=hold, args=(k,), daemon=True) for k in range(len(needs))]
    for thread in threads:
        thread.start()
    inside.wait(WAIT_S)
    assert all(s is not None and s >= n for s, n in zip(seen, needs, strict=True)), (seen, needs)
    assert max(own, *needs) == Image.MAX_IMAGE_PIXELS
    open_needs = list(needs)
    for step, k in enumerate(order):
        if step in sets:  # other code sets Pillow's limit while blocks are open: that is its own limit now,
            if sets[step] != Image.MAX_IMAGE_PIXELS:  # unless it is the value already there (no change to see)
                own = sets[step]
            Image.MAX_IMAGE_PIXELS = sets[step]
        leave[k].set()
        assert left[k].wait(WAIT_S), f"the block of thread {k} did not close within {WAIT_S} s"
        open_needs.remove(needs[k])
        assert max([own, *open_needs]) == Image.MAX_IMAGE_PIXELS
    for thread in threads:
        thread.join(WAIT_S)
    assert own == Image.MAX_IMAGE_PIXELS
