"""Hypothesis strategies for samples with media: images and clips of every kind, merge, temporal patch and
encoding, their placeholders inside the sample's tokens."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from topics.formats.media import MediaItem
from topics.formats.sample import Sample


@st.composite
def media_items(draw: st.DrawFn, token_offset: int) -> MediaItem:
    kind = draw(st.sampled_from(["image", "video"]))
    merge = draw(st.sampled_from([1, 2]))
    temporal = draw(st.sampled_from([1, 2]))
    patch = draw(st.sampled_from([1, 2, 4]))
    grid_t = 1 if kind == "image" else draw(st.integers(1, 3))
    grid_h, grid_w = (merge * draw(st.integers(1, 3)) for _ in range(2))
    encoding = draw(st.sampled_from(["raw", "jpeg", "png"]))
    frames = 1 if kind == "image" else grid_t * temporal
    size = grid_h * patch * grid_w * patch * 3
    payload = [draw(st.binary(min_size=size, max_size=size)) if encoding == "raw" else draw(st.binary(max_size=20))]
    return MediaItem(
        kind, grid_t, grid_h, grid_w, merge, temporal, grid_h * patch, grid_w * patch, token_offset, encoding,
        tuple(payload * frames),
    )  # fmt: skip


@st.composite
def media_samples(draw: st.DrawFn) -> Sample:
    items, offset = [], draw(st.integers(0, 3))
    for _ in range(draw(st.integers(1, 3))):
        item = draw(media_items(offset))
        items.append(item)
        offset += item.tokens + draw(st.integers(0, 3))
    tokens = np.arange(offset + draw(st.integers(0, 2)), dtype=np.int32)
    metadata = draw(st.dictionaries(st.text(max_size=3), st.text(max_size=3)))
    return Sample("s/a.jsonl/0", "s", tokens, metadata, tuple(items))
