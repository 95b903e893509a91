"""Media carried by a sample: images and video clips, decoded and resized by a source loader.

A ``MediaItem`` is one image or clip after the loader's resize. Its patch grid ``(t, h, w)`` is what
the constructor balances on (readable without touching pixels); its pixels travel in ``frames``, one
``bytes`` per frame, either raw (``uint8`` RGB, ``height * width * 3`` bytes, row-major) or re-encoded
(one JPEG or PNG per frame). The sample's tokens hold the item's placeholder tokens: the item's
``tokens`` placeholder ids start at ``token_offset``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

MediaKind = Literal["image", "video"]
MEDIA_KINDS: tuple[str, ...] = get_args(MediaKind)
PixelEncoding = Literal["raw", "jpeg", "png"]
PIXEL_ENCODINGS: tuple[str, ...] = get_args(PixelEncoding)
CHANNELS = 3
INT_FIELDS = (
    "grid_t",
    "grid_h",
    "grid_w",
    "merge_size",
    "temporal_patch_size",
    "height",
    "width",
    "token_offset",
)
"""A ``MediaItem``'s int fields, in the order the sample and batch formats store them (after ``kind``)."""


@dataclass(frozen=True, slots=True)
class MediaItem:
    """One image or clip, resized.

    ``grid_t, grid_h, grid_w``: temporal and spatial patches. ``height = grid_h * patch_size`` and
    ``width = grid_w * patch_size`` pixels; a clip has ``grid_t * temporal_patch_size`` frames, an image
    ``grid_t == 1`` and one frame, which the vision encoder sees ``temporal_patch_size`` times.
    ``merge_size``: the LLM gets one placeholder token per
    ``merge_size x merge_size`` patches, so ``tokens = grid_t * grid_h * grid_w // merge_size**2``.
    ``token_offset``: index in the sample's tokens of the first placeholder token.
    ``frames``: the frames, one ``bytes`` each (or a view of a record's bytes), in ``encoding``.
    """

    kind: str
    grid_t: int
    grid_h: int
    grid_w: int
    merge_size: int
    temporal_patch_size: int
    height: int
    width: int
    token_offset: int
    encoding: str
    frames: tuple[bytes | memoryview, ...]

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.grid_t, self.grid_h, self.grid_w

    @property
    def patches(self) -> int:
        """Patches the vision encoder sees: ``t * h * w``."""
        return self.grid_t * self.grid_h * self.grid_w

    @property
    def tokens(self) -> int:
        """Placeholder tokens in the LLM's sequence."""
        return self.patches // (self.merge_size * self.merge_size)

    @property
    def patch_size(self) -> int:
        return self.height // self.grid_h

    def check(self) -> None:
        """``ValueError`` naming the first field that breaks the invariants above."""
        if self.kind not in MEDIA_KINDS:
            msg = f"media kind {self.kind!r} is not one of {', '.join(MEDIA_KINDS)}"
            raise ValueError(msg)
        if self.encoding not in PIXEL_ENCODINGS:
            msg = f"pixel encoding {self.encoding!r} is not one of {', '.join(PIXEL_ENCODINGS)}"
            raise ValueError(msg)
        for name in ("grid_t", "grid_h", "grid_w", "merge_size", "temporal_patch_size", "height", "width"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                msg = f"media {name} must be an int >= 1, got {value!r}"
                raise ValueError(msg)
        if self.token_offset < 0:
            msg = f"media token_offset must be >= 0, got {self.token_offset}"
            raise ValueError(msg)
        h, w = self.height, self.width
        if h % self.grid_h or w % self.grid_w or h // self.grid_h != w // self.grid_w:
            msg = f"media of {h}x{w} pixels is not a grid of square patches {self.grid_h}x{self.grid_w}"
            raise ValueError(msg)
        if self.grid_h % self.merge_size or self.grid_w % self.merge_size:
            msg = f"media grid {self.grid_h}x{self.grid_w} is not a multiple of merge_size {self.merge_size}"
            raise ValueError(msg)
        expected = 1 if self.kind == "image" else self.grid_t * self.temporal_patch_size
        if len(self.frames) != expected or (self.kind == "image" and self.grid_t != 1):
            msg = f"{self.kind} of grid_t {self.grid_t} holds {len(self.frames)} frames, expected {expected}"
            raise ValueError(msg)
        if self.encoding == "raw":
            frame_bytes = self.height * self.width * CHANNELS
            if any(len(f) != frame_bytes for f in self.frames):
                msg = f"a raw frame of {self.height}x{self.width} RGB must hold {frame_bytes} bytes"
                raise ValueError(msg)
