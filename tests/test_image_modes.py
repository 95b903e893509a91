"""Images of every mode a PNG holds, prepared by the loaders and the sink exactly as transformers'
``Qwen2VLImageProcessorPil`` prepares the image a ``datasets`` ``Image()`` column decodes from the same file:
upright by its EXIF orientation, transparency (alpha bands, ``tRNS`` colour keys, alpha palettes) over white,
16-bit samples as Pillow converts them, the same resize and the same ``pixel_values``."""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from dataclasses import replace

import datasets
import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from connectors.media.config import VisionConfig
from connectors.media.decode import MediaDecoder
from connectors.multimodal_samples import InterleavedBuilder
from connectors.readers.base import Document, MediaRef
from tests.media_support import VISION, image_bytes, png_with_orientation, sixteen_bit_channels_png
from topics.formats.batch import Batch
from topics.formats.batch_codec import decode_batch, encode_batch
from trainer_sink.vlm.qwen2_vl import pack_media

Maker = Callable[[np.random.Generator, int, int], bytes]


def _levels(rng: np.random.Generator, shape: tuple[int, ...], top: int = 256) -> np.ndarray:
    """Values from a few levels below ``top``, so that a colour key drawn from the image marks many pixels."""
    return rng.choice(rng.integers(0, top, 4), size=shape)


def _key_of(pixels: np.ndarray, rng: np.random.Generator) -> tuple[int, ...]:
    """The value of a pixel of ``pixels`` (``[h, w, channels]``): a colour key that marks some pixels."""
    flat = pixels.reshape(-1, pixels.shape[-1])
    return tuple(int(v) for v in flat[rng.integers(0, len(flat))])


def _eight_bit(mode: str, *, keyed: bool = False) -> Maker:
    channels = {"1": 1, "L": 1, "LA": 2, "RGB": 3, "RGBA": 4}[mode]

    def make(rng: np.random.Generator, width: int, height: int) -> bytes:
        pixels = _levels(rng, (height, width, channels)).astype(np.uint8)
        if mode == "1":
            pixels = (pixels > 127).astype(np.uint8) * 255
        image = Image.fromarray(pixels[..., 0] if channels == 1 else pixels, "L" if channels == 1 else mode)
        image = image.convert("1") if mode == "1" else image
        if not keyed:
            return image_bytes(image)
        key = _key_of(pixels, rng)
        return image_bytes(image, transparency=key if mode == "RGB" else key[0] // (255 if mode == "1" else 1))

    return make


def _paletted(transparency: str) -> Maker:
    """A P image of up to 16 colours: no transparency, one transparent index, or an alpha palette."""

    def make(rng: np.random.Generator, width: int, height: int) -> bytes:
        colours = int(rng.integers(1, 17))
        image = Image.fromarray(rng.integers(0, colours, (height, width)).astype(np.uint8), "P")
        image.putpalette(rng.integers(0, 256, 3 * colours).astype(np.uint8).tobytes())
        if transparency == "index":
            return image_bytes(image, transparency=int(rng.integers(0, colours)))
        if transparency == "alpha":
            return image_bytes(image, transparency=rng.integers(0, 256, colours).astype(np.uint8).tobytes())
        return image_bytes(image)

    return make


def _sixteen_bit(channels: int, *, keyed: bool = False) -> Maker:
    """16 bits a sample, most values above 255 (which Pillow clips) and some below."""

    def make(rng: np.random.Generator, width: int, height: int) -> bytes:
        top = int(rng.choice([256, 1024, 65536]))
        samples = _levels(rng, (height, width, channels), top).astype(np.uint16)
        return sixteen_bit_channels_png(samples, _key_of(samples, rng) if keyed else None)

    return make


def _pillow_sixteen_bit(dtype: str) -> Maker:
    """A greyscale image Pillow holds as ``I;16`` (``<u2``) or ``I;16B`` (``>u2``), saved by Pillow."""

    def make(rng: np.random.Generator, width: int, height: int) -> bytes:
        top = int(rng.choice([256, 1024, 65536]))
        return image_bytes(Image.fromarray(_levels(rng, (height, width), top).astype(dtype)))

    return make


MAKERS: dict[str, Maker] = {
    "1": _eight_bit("1"),
    "1+tRNS": _eight_bit("1", keyed=True),
    "L": _eight_bit("L"),
    "L+tRNS": _eight_bit("L", keyed=True),
    "LA": _eight_bit("LA"),
    "P": _paletted("none"),
    "P+tRNS": _paletted("index"),
    "P+alpha-palette": _paletted("alpha"),
    "RGB": _eight_bit("RGB"),
    "RGB+tRNS": _eight_bit("RGB", keyed=True),
    "RGBA": _eight_bit("RGBA"),
    "I;16": _pillow_sixteen_bit("<u2"),
    "I;16B": _pillow_sixteen_bit(">u2"),
    "16-bit grey+tRNS": _sixteen_bit(1, keyed=True),
    "16-bit LA": _sixteen_bit(2),
    "16-bit RGB": _sixteen_bit(3),
    "16-bit RGB+tRNS": _sixteen_bit(3, keyed=True),
    "16-bit RGBA": _sixteen_bit(4),
}

BOUNDS = [(56 * 56, 56 * 56), (56 * 56, 28 * 28 * 16)]
"""(min_pixels, max_pixels): every image resized to about 56 x 56, or kept near its size up to 112 x 112."""


@functools.cache
def reference(min_pixels: int, max_pixels: int) -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)


def sink_pixels(data: bytes, config: VisionConfig) -> tuple[np.ndarray, np.ndarray]:
    """``pixel_values`` and ``image_grid_thw`` of a document holding the image ``data``: decoded by a loader's
    sample builder, through a batch's encoding on the topic, laid out by the sink."""
    ref = MediaRef("image", "rows.jsonl:row=0:image=0", data=data)
    document = Document("mm", "rows.jsonl", 0, parts=(ref,))
    (sample,) = InterleavedBuilder(MediaDecoder(config), max_length=10**6, eod_id=None).build(document, [])
    batch = Batch.from_samples(
        step=0, rank=0, ranks=1, capacity=sample.length, micro_batches=[[sample]], with_media=True
    )
    (media,) = pack_media(decode_batch(encode_batch(batch)[1]))
    return media.pixel_values, media.image_grid_thw


@settings(max_examples=80, deadline=None)
@given(
    kind=st.sampled_from(sorted(MAKERS)),
    seed=st.integers(0, 2**32 - 1),
    size=st.tuples(st.integers(1, 90), st.integers(1, 90)),
    bounds=st.sampled_from(BOUNDS),
    encoding=st.sampled_from(["raw", "png"]),
    orientation=st.sampled_from([1, 1, 1, 2, 3, 4, 5, 6, 7, 8]),  # upright most often
)
@example(kind="RGB+tRNS", seed=0, size=(1, 1), bounds=BOUNDS[0], encoding="raw", orientation=1)
@example(kind="16-bit grey+tRNS", seed=0, size=(3, 2), bounds=BOUNDS[1], encoding="png", orientation=1)
@example(kind="P+tRNS", seed=1, size=(30, 12), bounds=BOUNDS[1], encoding="raw", orientation=6)
def test_every_png_mode_is_prepared_as_transformers_prepares_it(
    kind: str, seed: int, size: tuple[int, int], bounds: tuple[int, int], encoding: str, orientation: int
) -> None:
    width, height = size
    data = png_with_orientation(MAKERS[kind](np.random.default_rng(seed), width, height), orientation)
    min_pixels, max_pixels = bounds
    config = replace(VISION, min_pixels=min_pixels, max_pixels=max_pixels, encoding=encoding)
    pixel_values, grid = sink_pixels(data, config)
    image = datasets.Image().decode_example({"bytes": data, "path": None})
    expected = reference(min_pixels, max_pixels)(image, return_tensors="np")
    np.testing.assert_array_equal(grid, expected["image_grid_thw"])
    where = f"{kind} {width}x{height} orientation {orientation}"
    np.testing.assert_array_equal(pixel_values, expected["pixel_values"], err_msg=where)


def test_the_generated_files_hold_the_modes_they_are_named_for() -> None:
    """Each maker writes what its name says, as Pillow opens it (so the property covers every mode)."""
    rng = np.random.default_rng(7)
    opened = {}
    for kind, make in MAKERS.items():
        with Image.open(io.BytesIO(make(rng, 9, 7))) as image:
            opened[kind] = (image.mode, "transparency" in image.info)
    assert opened == {
        "1": ("1", False),
        "1+tRNS": ("1", True),
        "L": ("L", False),
        "L+tRNS": ("L", True),
        "LA": ("LA", False),
        "P": ("P", False),
        "P+tRNS": ("P", True),
        "P+alpha-palette": ("P", True),
        "RGB": ("RGB", False),
        "RGB+tRNS": ("RGB", True),
        "RGBA": ("RGBA", False),
        "I;16": ("I;16", False),
        "I;16B": ("I;16", False),
        "16-bit grey+tRNS": ("I;16", True),
        "16-bit LA": ("RGBA", False),
        "16-bit RGB": ("RGB", False),
        "16-bit RGB+tRNS": ("RGB", True),
        "16-bit RGBA": ("RGBA", False),
    }
