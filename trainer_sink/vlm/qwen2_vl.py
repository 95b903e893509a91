"""Qwen2-VL's conventions, as the sink lays a batch's media out for it: per micro-batch vision inputs in the
layout Qwen2-VL takes them, and its 3-D rotary positions (M-RoPE); numpy only. Another VLM family's layout is
a module of its own beside this one.

``pack_media`` gives, next to ``topics.formats.packing.pack_micro_batches``' arrays, each micro-batch's images and
clips as the vision encoder's patches and the positions of their placeholder tokens:

- ``pixel_values`` float32 [image patches, 3 * temporal_patch_size * patch_size**2]: every image of the
  micro-batch in row order, its pixels scaled to [0, 1] and normalized per channel, its one frame repeated
  ``temporal_patch_size`` times, each patch flattened as (channel, time, row, column) and the patches of an
  image ordered merge window by merge window (``merge_size x merge_size`` patches each, row-major within
  and across windows): exactly what transformers' ``Qwen2VLImageProcessor`` gives (bit for bit with the
  default mean and std: the same float32 arithmetic, as a lookup table). ``pixel_values_videos`` the same for
  clips, temporal patch by temporal patch (``Qwen2VLVideoProcessor``'s order).
- ``image_grid_thw``, ``video_grid_thw`` int64 [items, 3]: each item's patch grid (t, h, w).
- ``image_cu_seqlens``, ``video_cu_seqlens`` int32: the encoder's attention blocks, one per temporal patch of
  each item (``h * w`` patches each), as Qwen2-VL's vision transformer builds them from the grids.
- ``mm_token_type_ids`` int32 [T]: 0 on text, 1 on an image's placeholder tokens, 2 on a clip's
  (transformers' ``mm_token_type_ids``).
- ``mrope_position_ids`` int32 [3, T]: the 3-D rotary positions of each sample alone (``mrope_positions``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from topics.errors import MixflowError
from topics.formats.batch import Batch
from topics.formats.media import CHANNELS
from topics.formats.media_column import MediaTable
from topics.formats.media_pixels import frames_array

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
TEXT, IMAGE, VIDEO = 0, 1, 2
"""``mm_token_type_ids`` values."""


class PixelOptionsError(MixflowError, ValueError):
    """A batch whose media items were cut into patches of other sizes than the sink's ``PixelOptions`` say."""


@dataclass(frozen=True)
class PixelOptions:
    """How frames become the encoder's input: per-channel ``image_mean`` and ``image_std`` (of pixels scaled to
    [0, 1]; Qwen2-VL's, the OpenAI CLIP ones, by default) and the encoder's ``patch_size`` and
    ``temporal_patch_size``, which every item must have (they also give an empty micro-batch its shapes)."""

    image_mean: tuple[float, ...] = OPENAI_CLIP_MEAN
    image_std: tuple[float, ...] = OPENAI_CLIP_STD
    patch_size: int = 14
    temporal_patch_size: int = 2

    def __post_init__(self) -> None:
        if len(self.image_mean) != CHANNELS or len(self.image_std) != CHANNELS or min(self.image_std) <= 0:
            msg = f"image_mean and image_std need {CHANNELS} values each, std above 0"
            raise ValueError(msg)
        if self.patch_size < 1 or self.temporal_patch_size < 1:
            msg = "patch_size and temporal_patch_size must be at least 1"
            raise ValueError(msg)

    @property
    def patch_dim(self) -> int:
        return CHANNELS * self.temporal_patch_size * self.patch_size * self.patch_size

    @functools.cached_property
    def lookup(self) -> np.ndarray:
        """float32 [3, 256]: the normalized value of each channel's byte, computed as transformers' numpy
        image processor does (rescale in float64 to float32, then ``(x - mean) / std`` in float32)."""
        scaled = (np.arange(256, dtype=np.float64) * (1 / 255)).astype(np.float32)
        mean = np.asarray(self.image_mean, np.float32)[:, None]
        std = np.asarray(self.image_std, np.float32)[:, None]
        return (scaled[None, :] - mean) / std


@dataclass(frozen=True)
class PackedMedia:
    """One micro-batch's vision inputs (see the module's docstring)."""

    pixel_values: np.ndarray
    image_grid_thw: np.ndarray
    image_cu_seqlens: np.ndarray
    pixel_values_videos: np.ndarray
    video_grid_thw: np.ndarray
    video_cu_seqlens: np.ndarray
    mm_token_type_ids: np.ndarray
    mrope_position_ids: np.ndarray


def pack_media(batch: Batch, options: PixelOptions | None = None) -> list[PackedMedia]:
    """``batch.micro_batches`` micro-batches' vision inputs, in order, empty ones included. ``PixelOptionsError``
    when an item's patch sizes differ from ``options``; ``DecodeError`` when a JPEG or PNG frame does not decode
    to the item's size."""
    options = options or PixelOptions()
    media, offsets = batch.media, batch.offsets
    _check_patch_sizes(media, options)
    positions = mrope_positions(offsets, media)
    types = np.zeros(int(offsets[-1]), np.int32)
    if len(media):
        first = offsets[media.row] + media.ints["token_offset"]
        q = np.arange(int(media.tokens.sum())) - np.repeat(np.cumsum(media.tokens) - media.tokens, media.tokens)
        kinds = np.where(np.asarray(media.kind) == "image", IMAGE, VIDEO).astype(np.int32)
        types[np.repeat(first, media.tokens) + q] = np.repeat(kinds, media.tokens)
    rows = np.searchsorted(batch.micro_batch, np.arange(batch.micro_batches + 1), side="left")
    out = []
    for m in range(batch.micro_batches):
        lo, hi = int(rows[m]), int(rows[m + 1])
        start, stop = int(offsets[lo]), int(offsets[hi])
        items = range(int(media.row_offsets[lo]), int(media.row_offsets[hi]))
        images = [k for k in items if media.kind[k] == "image"]
        videos = [k for k in items if media.kind[k] != "image"]
        image_pixels, image_grid, image_cu = _vision_input(media, images, options)
        video_pixels, video_grid, video_cu = _vision_input(media, videos, options)
        out.append(
            PackedMedia(
                pixel_values=image_pixels,
                image_grid_thw=image_grid,
                image_cu_seqlens=image_cu,
                pixel_values_videos=video_pixels,
                video_grid_thw=video_grid,
                video_cu_seqlens=video_cu,
                mm_token_type_ids=types[start:stop],
                mrope_position_ids=positions[:, start:stop],
            )
        )
    return out


def _check_patch_sizes(media: MediaTable, options: PixelOptions) -> None:
    sizes = media.ints["height"] // np.maximum(media.ints["grid_h"], 1)
    for field, values, expected in (
        ("patch_size", sizes, options.patch_size),
        ("temporal_patch_size", media.ints["temporal_patch_size"], options.temporal_patch_size),
    ):
        if np.any(values != expected):
            found = int(values[int(np.argmax(values != expected))])
            msg = (
                f"the job's media items have {field} {found} (its spec's vision.{field}), the sink's PixelOptions "
                f"say {expected}: give PixelOptions({field}={found})"
            )
            raise PixelOptionsError(msg)


def _vision_input(
    media: MediaTable, items: Sequence[int], options: PixelOptions
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The items' patches (float32 [patches, patch_dim]), grids (int64 [items, 3]) and the encoder's
    attention blocks (int32 cu_seqlens: one block of ``h * w`` patches per temporal patch)."""
    grid = np.stack([media.ints[name][list(items)] for name in ("grid_t", "grid_h", "grid_w")], axis=1)
    grid = grid.reshape(-1, 3).astype(np.int64)
    blocks = np.repeat(grid[:, 1] * grid[:, 2], grid[:, 0])
    cu_seqlens = np.zeros(blocks.size + 1, np.int32)
    np.cumsum(blocks, out=cu_seqlens[1:])
    pixels = np.empty((int(cu_seqlens[-1]), options.patch_dim), np.float32)
    at = 0
    for k in items:
        patches = media.int_at(k, "grid_t") * media.int_at(k, "grid_h") * media.int_at(k, "grid_w")
        patchify(_frames(media, k), media.int_at(k, "merge_size"), options, out=pixels[at : at + patches])
        at += patches
    return pixels, grid, cu_seqlens


def _frames(media: MediaTable, k: int) -> np.ndarray:
    if media.encoding[k] == "raw":
        return media.raw_frames(k)
    return frames_array(media.item(k))


def patchify(frames: np.ndarray, merge_size: int, options: PixelOptions, out: np.ndarray | None = None) -> np.ndarray:
    """float32 [grid_t * grid_h * grid_w, patch_dim]: ``frames`` (uint8 [frames, height, width, 3]: the one frame
    of an image, ``grid_t * temporal_patch_size`` of a clip) as normalized patches in Qwen2-VL's order, written
    into ``out`` when given."""
    n, height, width, _ = frames.shape
    p, m, tp = options.patch_size, merge_size, options.temporal_patch_size
    grid_t, gh, gw = max(n // tp, 1), height // p, width // p
    if out is None:
        out = np.empty((grid_t * gh * gw, options.patch_dim), np.float32)
    source = frames.reshape(grid_t, n // grid_t, gh // m, m, p, gw // m, m, p, CHANNELS)
    # [t, h / m, w / m, m, m, channel, temporal, p, p]
    source = source.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)
    target = out.reshape(grid_t, gh // m, gw // m, m, m, CHANNELS, tp, p, p)
    frames_per_patch = source.shape[6]  # an image has one, which the encoder sees temporal_patch_size times
    for c in range(CHANNELS):
        target[..., c, :frames_per_patch, :, :] = options.lookup[c][source[..., c, :, :, :]]
    if frames_per_patch < tp:
        target[..., frames_per_patch:, :, :] = target[..., :frames_per_patch, :, :]
    return out


# -- M-RoPE ----------------------------------------------------------------------------------------


def mrope_positions(offsets: np.ndarray, media: MediaTable) -> np.ndarray:
    """int32 [3, total tokens]: each sample's 3-D rotary positions, restarting at every sample, as
    ``get_rope_index`` of transformers 5.x's ``Qwen2VLModel`` computes them for each sample alone. ``offsets``
    int64 [samples + 1] into the batch's tokens; ``media`` the batch's items, in placeholder order within a row.

    Within a sample, text tokens count up from 0 on all three rows. An image or clip whose placeholders start
    where the count stands at ``s`` gives its ``t x h x w`` placeholders (the merged grid: ``grid_t``,
    ``grid_h / merge_size``, ``grid_w / merge_size``, row-major) the positions ``(s + t_i, s + h_i, s + w_i)``,
    and the text after it resumes at ``s + max(h, w)``, as that ``get_rope_index`` does (an earlier release
    resumed at ``s + max(t, h, w)``: they differ only for a clip of more merged frames than rows and columns)."""
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
