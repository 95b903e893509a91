"""How a source's images and clips become patches and placeholder tokens: the spec's ``vision`` section."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topics.formats.media import PIXEL_ENCODINGS, MediaItem, MediaKind, PixelEncoding
from topics.formats.media_pixels import encode_frames

TOKEN_ID_LIMIT = 2**31


@dataclass(frozen=True)
class VisionConfig:
    """The Qwen2-VL conventions, per source.

    Resize ("smart resize"): each side becomes a multiple of ``patch_size * merge_size``, the aspect
    ratio is kept, and the pixels of an image end between ``min_pixels`` and ``max_pixels``, those of a
    clip's frames between ``video_min_pixels`` and ``video_max_pixels``. A clip is
    sampled at ``video_fps`` frames per second, at most ``video_max_frames`` frames, its frame count a
    multiple of ``temporal_patch_size``. An image or clip becomes ``vision_start_id``, then one
    ``image_token_id`` (``video_token_id``) per ``merge_size x merge_size`` patches, then
    ``vision_end_id`` in the token sequence. Pixels travel as ``encoding`` (``raw`` uint8 RGB, or
    each frame re-encoded as ``jpeg`` at ``jpeg_quality`` or ``png``). An image of more than
    ``max_decoded_pixels`` pixels before resizing is refused (a decompression bomb), as is one with a
    side of 0; Pillow's own limit follows ``max_decoded_pixels`` while an image opens (``pillow_limit``).
    ``ValueError`` naming the field for a value outside these rules.
    """

    image_token_id: int
    video_token_id: int
    vision_start_id: int
    vision_end_id: int
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    video_min_pixels: int = 128 * 28 * 28
    video_max_pixels: int = 768 * 28 * 28
    video_fps: float = 2.0
    video_max_frames: int = 16
    encoding: PixelEncoding = "jpeg"
    jpeg_quality: int = 90
    max_decoded_pixels: int = 64 * 1024 * 1024

    @property
    def factor(self) -> int:
        """Each resized side is a multiple of this: ``patch_size * merge_size``."""
        return self.patch_size * self.merge_size

    def __post_init__(self) -> None:
        for name in ("image_token_id", "video_token_id", "vision_start_id", "vision_end_id"):
            if not 0 <= getattr(self, name) < TOKEN_ID_LIMIT:
                msg = f"vision {name} must be in [0, 2**31), got {getattr(self, name)}"
                raise ValueError(msg)
        for name in ("patch_size", "merge_size", "temporal_patch_size", "min_pixels", "max_decoded_pixels"):
            if getattr(self, name) < 1:
                msg = f"vision {name} must be >= 1, got {getattr(self, name)}"
                raise ValueError(msg)
        for low, high in (("min_pixels", "max_pixels"), ("video_min_pixels", "video_max_pixels")):
            if getattr(self, low) < 1 or getattr(self, high) < getattr(self, low):
                msg = f"vision {high} {getattr(self, high)} must be >= {low} {getattr(self, low)} >= 1"
                raise ValueError(msg)
        if not self.video_fps > 0:
            msg = f"vision video_fps must be > 0, got {self.video_fps}"
            raise ValueError(msg)
        if self.video_max_frames < self.temporal_patch_size:
            frames, patch = self.video_max_frames, self.temporal_patch_size
            msg = f"vision video_max_frames {frames} must be >= temporal_patch_size {patch}"
            raise ValueError(msg)
        if self.encoding not in PIXEL_ENCODINGS:
            msg = f"vision encoding {self.encoding!r} is not one of {', '.join(PIXEL_ENCODINGS)}"
            raise ValueError(msg)
        if not 1 <= self.jpeg_quality <= 100:
            msg = f"vision jpeg_quality must be in [1, 100], got {self.jpeg_quality}"
            raise ValueError(msg)

    def item(self, kind: MediaKind, pixels: np.ndarray) -> MediaItem:
        """The ``MediaItem`` of resized frames ``pixels`` (uint8 ``[frames, height, width, 3]``; an image one
        frame, a clip a multiple of ``temporal_patch_size``), encoded as ``encoding``, ``token_offset`` 0."""
        count, height, width = pixels.shape[:3]
        return MediaItem(
            kind=kind,
            grid_t=1 if kind == "image" else count // self.temporal_patch_size,
            grid_h=height // self.patch_size,
            grid_w=width // self.patch_size,
            merge_size=self.merge_size,
            temporal_patch_size=self.temporal_patch_size,
            height=height,
            width=width,
            token_offset=0,
            encoding=self.encoding,
            frames=encode_frames(pixels, self.encoding, jpeg_quality=self.jpeg_quality),
        )
