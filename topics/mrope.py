"""Qwen2-VL's 3-D rotary positions (M-RoPE) of packed samples, as ``get_rope_index`` of transformers 5.x's
``Qwen2VLModel`` computes them for each sample alone, for every sample of a batch at once (numpy).

Within a sample, text tokens count up from 0 on all three rows. An image or clip whose placeholders start
where the count stands at ``s`` gives its ``t x h x w`` placeholders (the merged grid: ``grid_t``,
``grid_h / merge_size``, ``grid_w / merge_size``, row-major) the positions ``(s + t_i, s + h_i, s + w_i)``,
and the text after it resumes at ``s + max(h, w)``, as that ``get_rope_index`` does (an earlier release
resumed at ``s + max(t, h, w)``: they differ only for a clip of more merged frames than rows and columns).
"""

from __future__ import annotations

import numpy as np

from topics.media_column import MediaTable


def mrope_positions(offsets: np.ndarray, media: MediaTable) -> np.ndarray:
    """int32 [3, total tokens]: each sample's positions, restarting at every sample. ``offsets`` int64
    [samples + 1] into the batch's tokens; ``media`` the batch's items, in placeholder order within a row."""
    total = int(offsets[-1])
    lengths = np.diff(offsets)
    local = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    if not len(media):
        return np.broadcast_to(local.astype(np.int32), (3, total)).copy()
    merge = media.ints["merge_size"]
    grid_h, grid_w = media.ints["grid_h"] // merge, media.ints["grid_w"] // merge
    count = media.tokens
    first = offsets[media.row] + media.ints["token_offset"]
    # Each block moves the positions after it by span - count, up to the end of its sample.
    shrink = count - np.maximum(grid_h, grid_w)
    change = np.zeros(total + 1, np.int64)
    np.add.at(change, first + count, -shrink)
    np.add.at(change, offsets[media.row + 1], shrink)
    shift = np.cumsum(change[:-1])
    out = np.broadcast_to(local + shift, (3, total)).copy()
    start = local[first] + shift[first]  # where the count stands at each block
    q = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    width, plane = np.repeat(grid_w, count), np.repeat(grid_h * grid_w, count)
    base = np.repeat(start, count)
    where = np.repeat(first, count) + q
    out[0, where] = base + q // plane
    out[1, where] = base + (q % plane) // width
    out[2, where] = base + q % width
    return out.astype(np.int32)
