"""Synthetic multimodal samples for the media benchmarks, in the loaders' format: captioned images of a given
size, clips of several frames, and text, as ``Sample`` objects ready for ``encode_sample``.

Pixels are real: crops of the photographs matplotlib ships (``mpl-data/sample_data``; rendered gradients and
shapes where it is missing), resized with Pillow's BICUBIC to the Qwen2-VL smart size (patch 14, merge 2) and
given sensor-like noise, each frame JPEG-encoded (q90) by the loaders' encoder (``encode_frames``). A few
distinct pictures of each size are encoded and their bytes reused across samples, so that writing a large data
job costs little CPU."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from benchmarks.throughput_bench import VOCAB, token_ids
from connectors.media.resize import smart_resize
from topics.formats.media import MediaItem
from topics.formats.media_pixels import encode_frames
from topics.formats.sample import Sample

PATCH, MERGE, TEMPORAL = 14, 2, 2
VISION_IDS = {
    "vision_start_id": VOCAB,
    "vision_end_id": VOCAB + 1,
    "image_token_id": VOCAB + 2,
    "video_token_id": VOCAB + 3,
}
"""Past the text vocabulary, as a tokenizer's added special tokens are."""
ASPECTS = (4 / 3, 3 / 4, 1.0, 16 / 9)
CLIP_FRAMES = 8
CLIP_PIXELS = 448 * 336
"""A clip: 8 frames (4 temporal patches) of about 0.15 megapixels."""
DISTINCT = 12
"""Distinct pictures (and clips) of each size, their encoded bytes reused across samples."""
CAPTION = (8, 64)
"""Caption tokens of an image or clip, uniform in this range."""


def image_source(megapixels: float) -> str:
    """The data job's source of images of ``megapixels``, e.g. ``images_0_25mp``."""
    return f"images_{megapixels:g}mp".replace(".", "_")


def base_pictures() -> list[np.ndarray]:
    """The photographs matplotlib ships, RGB; a rendered scene where matplotlib is missing."""
    try:
        import matplotlib

        folder = Path(matplotlib.get_data_path()) / "sample_data"
        names = ("grace_hopper.jpg", "Minduka_Present_Blue_Pack.png")
        return [np.asarray(Image.open(folder / name).convert("RGB")) for name in names]
    except (ImportError, OSError):
        ys, xs = np.mgrid[0:600, 0:800]
        image = Image.fromarray(np.stack([xs * 255 // 800, ys * 255 // 600, (xs + ys) % 256], -1).astype(np.uint8))
        draw = ImageDraw.Draw(image)
        for k in range(30):
            draw.ellipse((k * 25, k * 17, k * 25 + 90, k * 17 + 60), fill=(k * 8, 255 - k * 8, 128))
        return [np.asarray(image)]


def smart_size(megapixels: float, aspect: float) -> tuple[int, int]:
    """(height, width) of an image of about ``megapixels`` and ``aspect`` (width / height), smart-resized."""
    height = math.sqrt(megapixels * 1e6 / aspect)
    factor = PATCH * MERGE
    return smart_resize(round(height), round(height * aspect), factor=factor, min_pixels=factor**2, max_pixels=1 << 26)


def picture(rng: np.random.Generator, bases: list[np.ndarray], height: int, width: int, shift: int = 0) -> np.ndarray:
    """A crop of one of ``bases`` (``shift`` pixels to the right: a clip's pan) resized to ``height x width``,
    with noise of a camera's sensor."""
    base = bases[int(rng.integers(len(bases)))]
    rows, cols, _ = base.shape
    side = int(rng.integers(min(rows, cols) // 2, min(rows, cols) + 1))
    top, left = int(rng.integers(0, rows - side + 1)), int(rng.integers(0, cols - side + 1))
    left = min(cols - side, left + shift)
    crop = Image.fromarray(base[top : top + side, left : left + side]).resize((width, height), Image.Resampling.BICUBIC)
    noisy = np.asarray(crop, np.int16) + rng.normal(0, 3, (height, width, 3)).astype(np.int16)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def image_items(rng: np.random.Generator, bases: list[np.ndarray], megapixels: float) -> list[MediaItem]:
    """``DISTINCT`` images of about ``megapixels``, each its own aspect and crop, placeholders from token 1."""
    items = []
    for k in range(DISTINCT):
        height, width = smart_size(megapixels, ASPECTS[k % len(ASPECTS)])
        frames = encode_frames(picture(rng, bases, height, width)[None], "jpeg")
        items.append(_item("image", 1, height, width, frames))
    return items


def clip_items(rng: np.random.Generator, bases: list[np.ndarray]) -> list[MediaItem]:
    """``DISTINCT`` clips of ``CLIP_FRAMES`` frames panning across a picture."""
    height, width = smart_size(CLIP_PIXELS / 1e6, 4 / 3)
    items = []
    for _ in range(DISTINCT):
        seed = int(rng.integers(1 << 30))
        frames = [picture(np.random.default_rng(seed), bases, height, width, 4 * f) for f in range(CLIP_FRAMES)]
        items.append(_item("video", CLIP_FRAMES // TEMPORAL, height, width, encode_frames(np.stack(frames), "jpeg")))
    return items


def _item(kind: str, grid_t: int, height: int, width: int, frames: tuple[bytes, ...]) -> MediaItem:
    return MediaItem(kind, grid_t, height // PATCH, width // PATCH, MERGE, TEMPORAL, height, width, 1, "jpeg", frames)


def media_samples(rng: np.random.Generator, source: str, items: list[MediaItem], count: int) -> Iterator[Sample]:
    """``count`` samples of ``source``, each one of ``items`` (in turn) then a caption: the vision start token,
    the item's placeholders, the vision end token, the caption's tokens."""
    placeholder = VISION_IDS["image_token_id" if items[0].kind == "image" else "video_token_id"]
    for i in range(count):
        item = items[i % len(items)]
        caption = token_ids(rng, int(rng.integers(*CAPTION)))
        tokens = np.concatenate(
            [[VISION_IDS["vision_start_id"]], np.full(item.tokens, placeholder), [VISION_IDS["vision_end_id"]], caption]
        ).astype(np.int32)
        yield Sample(f"{source}/synthetic/{i}", source, tokens, media=(item,))


def sample_tokens(item: MediaItem) -> int:
    """The tokens of a sample of ``media_samples`` holding ``item``, its caption at its mean length."""
    return item.tokens + 2 + sum(CAPTION) // 2
