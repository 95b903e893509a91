"""A small multimodal source for job tests: WebDataset tar shards of image-text pairs that Pillow renders here
(each image shows its caption), and the spec entry that reads them with a cheap ``vision`` section."""

from __future__ import annotations

import io
import random
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

VISION_SECTION: dict[str, Any] = {
    # After the 1,024 ids of the example tokenizer the tests build (tests/loader_support.py): the builder places
    # these, the tokenizer never makes them.
    "image_token_id": 1024,
    "video_token_id": 1025,
    "vision_start_id": 1026,
    "vision_end_id": 1027,
    "min_pixels": 28 * 28,
    "max_pixels": 28 * 28 * 6,  # at most 24 patches, 6 placeholder tokens an image
}
"""Qwen2-VL's layout (14 px patches, 2 x 2 merged) at a few patches an image, JPEG frames on the topic."""

WORDS = ("a", "red", "blue", "kite", "over", "the", "river", "chart", "of", "sales", "small", "cat", "code", "line")


def caption_image(caption: str, rng: random.Random) -> tuple[str, bytes]:
    """``caption`` drawn on a background of a random colour and size: ``(extension, bytes)``, PNG or JPEG."""
    width, height = rng.randint(24, 160), rng.randint(24, 120)
    image = Image.new("RGB", (width, height), (rng.randint(0, 255), rng.randint(0, 255), rng.randint(0, 255)))
    ImageDraw.Draw(image).text((2, 2), caption, fill=(255 - image.getpixel((0, 0))[0], 240, 30))
    out = io.BytesIO()
    if rng.random() < 0.5:
        image.save(out, format="PNG")
        return "png", out.getvalue()
    image.save(out, format="JPEG", quality=85)
    return "jpg", out.getvalue()


def add_member(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(payload), 0
    tar.addfile(info, io.BytesIO(payload))


def write_shard(path: Path, members: Iterable[tuple[str, bytes]]) -> None:
    """An uncompressed tar of ``(name, bytes)`` members, in order (USTAR, no timestamps)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, payload in members:
            add_member(tar, name, payload)


def caption_pair(key: str, rng: random.Random) -> list[tuple[str, bytes]]:
    """The members of one pair: ``<key>.png`` or ``<key>.jpg``, and ``<key>.txt``."""
    caption = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 24)))
    extension, image = caption_image(caption, rng)
    return [(f"{key}.{extension}", image), (f"{key}.txt", caption.encode())]


def write_caption_shards(folder: Path, pairs: int, per_shard: int = 20, seed: int = 0) -> list[Path]:
    """``pairs`` image-text pairs in shards of ``per_shard`` under ``folder``; the shards."""
    rng = random.Random(seed)
    shards = []
    for start in range(0, pairs, per_shard):
        path = folder / f"pairs-{start // per_shard:04d}.tar"
        members = [m for k in range(start, min(start + per_shard, pairs)) for m in caption_pair(f"{k:06d}", rng)]
        write_shard(path, members)
        shards.append(path)
    return shards


def caption_source(name: str, folder: Path, **extra: Any) -> dict[str, Any]:
    """A spec's source entry for the shards under ``folder``."""
    return {
        "name": name,
        "reader": "webdataset",
        "path": str(folder),
        "max_sample_length": 512,
        "eod_token_id": 0,
        "vision": dict(VISION_SECTION),
        **extra,
    }
