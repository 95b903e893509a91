"""How a source's images and clips become patches and placeholder tokens: the spec's ``vision`` section."""

from __future__ import annotations

from dataclasses import dataclass

from topics.media import PixelEncoding


@dataclass(frozen=True)
class VisionConfig:
    """The Qwen2-VL conventions, per source.

    Resize ("smart resize"): each side becomes a multiple of ``patch_size * merge_size``, the aspect
    ratio is kept, and the pixels of a frame end between ``min_pixels`` and ``max_pixels``. A clip is
    sampled at ``video_fps`` frames per second, at most ``video_max_frames`` frames, its frame count a
    multiple of ``temporal_patch_size``. An image or clip becomes ``vision_start_id``, then one
    ``image_token_id`` (``video_token_id``) per ``merge_size x merge_size`` patches, then
    ``vision_end_id`` in the token sequence. Pixels travel as ``encoding`` (``raw`` uint8 RGB, or
    each frame re-encoded as ``jpeg`` at ``jpeg_quality`` or ``png``). An image of more than
    ``max_decoded_pixels`` pixels before resizing is refused (a decompression bomb), as is one with a
    side of 0.
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
    video_fps: float = 2.0
    video_max_frames: int = 16
    encoding: PixelEncoding = "raw"
    jpeg_quality: int = 90
    max_decoded_pixels: int = 64 * 1024 * 1024

    @property
    def factor(self) -> int:
        """Each resized side is a multiple of this: ``patch_size * merge_size``."""
        return self.patch_size * self.merge_size
