"""Samples with images and clips for the batch, packing and sink tests: random grids, frames from numpy,
placeholder tokens laid out as the loaders write them (vision start, placeholders, vision end)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hypothesis import strategies as st

from topics.formats.batch import Batch
from topics.formats.media import MediaItem
from topics.formats.media_pixels import encode_frames
from topics.formats.sample import Sample

VOCAB = 300
IMAGE_TOKEN, VIDEO_TOKEN, VISION_START, VISION_END = 290, 291, 292, 293
TEXT_TOKENS = 280
"""Text token ids are below this; the four above are the vision ones."""
PATCH, MERGE, TEMPORAL = 14, 2, 2

Spec = tuple[str, tuple[int, int, int]]
"""A media item to make: kind and patch grid (t, h, w)."""


def frames_for(rng: np.random.Generator, kind: str, grid: tuple[int, int, int]) -> np.ndarray:
    """uint8 [frames, height, width, 3]: smooth gradients with noise (JPEG keeps them close)."""
    t, h, w = grid
    n = 1 if kind == "image" else t * TEMPORAL
    height, width = h * PATCH, w * PATCH
    ys, xs = np.mgrid[0:height, 0:width]
    base = (ys[None, :, :, None] * 3 + xs[None, :, :, None] * 2 + rng.integers(0, 256, (n, 1, 1, 3))) % 256
    noise = rng.integers(0, 16, (n, height, width, 3))
    return ((base + noise) % 256).astype(np.uint8)


def media_sample(
    rng: np.random.Generator,
    sample_id: str,
    specs: Sequence[Spec],
    *,
    encoding: str = "raw",
    source: str = "vl",
    text: tuple[int, int] = (0, 6),
) -> Sample:
    """A sample of text runs (lengths in ``text``) around one block per spec, in order."""
    tokens: list[int] = []
    items = []
    for kind, grid in specs:
        tokens += rng.integers(0, TEXT_TOKENS, int(rng.integers(*text))).tolist()
        tokens.append(VISION_START)
        frames = frames_for(rng, kind, grid)
        item = MediaItem(
            kind=kind,
            grid_t=grid[0],
            grid_h=grid[1],
            grid_w=grid[2],
            merge_size=MERGE,
            temporal_patch_size=TEMPORAL,
            height=grid[1] * PATCH,
            width=grid[2] * PATCH,
            token_offset=len(tokens),
            encoding=encoding,
            frames=encode_frames(frames, encoding),  # type: ignore[arg-type]
        )
        item.check()
        items.append(item)
        tokens += [IMAGE_TOKEN if kind == "image" else VIDEO_TOKEN] * item.tokens
        tokens.append(VISION_END)
    tokens += rng.integers(0, TEXT_TOKENS, int(rng.integers(max(text[0], 1), text[1] + 1))).tolist()
    return Sample(sample_id, source, np.asarray(tokens, np.int32), media=tuple(items))


grids = st.tuples(st.just(1), st.integers(1, 3).map(lambda n: n * MERGE), st.integers(1, 3).map(lambda n: n * MERGE))
clip_grids = st.tuples(
    st.integers(1, 3), st.integers(1, 2).map(lambda n: n * MERGE), st.integers(1, 2).map(lambda n: n * MERGE)
)
specs = st.lists(
    st.one_of(grids.map(lambda g: ("image", g)), clip_grids.map(lambda g: ("video", g))), min_size=0, max_size=3
)


@st.composite
def media_batches(draw, encodings: Sequence[str] = ("raw",)) -> Batch:
    """A batch with media: 1-3 micro-batches of 0-3 samples, each with 0-3 items (text-only samples too)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    encoding = draw(st.sampled_from(list(encodings)))
    groups = [
        [media_sample(rng, f"vl/{m}/{j}", draw(specs), encoding=encoding) for j in range(draw(st.integers(0, 3)))]
        for m in range(draw(st.integers(1, 3)))
    ]
    most = max(sum(s.length for s in group) for group in groups)
    patches = max(sum(s.patches for s in group) for group in groups)
    budget = draw(st.one_of(st.none(), st.integers(max(patches, 1), max(patches, 1) + 50)))
    return Batch.from_samples(
        step=draw(st.integers(0, 2**40)),
        rank=0,
        ranks=draw(st.integers(1, 4)),
        capacity=max(most, 1) + draw(st.integers(0, 5)),
        micro_batches=groups,
        with_media=True,
        patches_per_micro_batch=budget,
    )
