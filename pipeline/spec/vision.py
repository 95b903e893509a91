"""A multimodal source's ``vision`` section: how its images and clips become patches and placeholder tokens.

The fields are those of ``connectors.media.config.VisionConfig`` (the Qwen2-VL conventions), checked here;
a source loader turns the section into that config."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipeline.spec._problems import Problems


class VisionSpec(BaseModel):
    """Resize, frame sampling, placeholder tokens and pixel encoding of one multimodal source."""

    model_config = ConfigDict(extra="forbid")

    image_token_id: int = Field(description="Placeholder token of an image, one per merge_size^2 patches.", ge=0)
    video_token_id: int = Field(description="Placeholder token of a clip, one per merge_size^2 patches.", ge=0)
    vision_start_id: int = Field(description="Token before each image's or clip's placeholders.", ge=0)
    vision_end_id: int = Field(description="Token after each image's or clip's placeholders.", ge=0)
    patch_size: int = Field(14, ge=1, le=1024, description="Pixels per side of a vision patch.")
    merge_size: int = Field(2, ge=1, le=16, description="Patches per side merged into one LLM token.")
    temporal_patch_size: int = Field(2, ge=1, le=64, description="Frames per temporal patch.")
    min_pixels: int = Field(56 * 56, ge=1, description="Fewest pixels of a resized image.")
    max_pixels: int = Field(28 * 28 * 1280, ge=1, description="Most pixels of a resized image.")
    video_min_pixels: int = Field(128 * 28 * 28, ge=1, description="Fewest pixels of a clip's resized frames.")
    video_max_pixels: int = Field(768 * 28 * 28, ge=1, description="Most pixels of a clip's resized frames.")
    video_fps: float = Field(2.0, gt=0, le=240, allow_inf_nan=False, description="Frames sampled per second of clip.")
    video_max_frames: int = Field(16, ge=1, le=4096, description="Most frames sampled from one clip.")
    encoding: Literal["raw", "jpeg", "png"] = Field(
        "jpeg",
        description="Pixels on the topic: each frame re-encoded as JPEG (10-18x smaller than raw, a few ms to "
        "decode on the sink's prefetch thread), as PNG (lossless), or raw uint8 RGB (no decoding, exact).",
    )
    jpeg_quality: int = Field(90, ge=1, le=100, description="JPEG quality when encoding is jpeg.")
    max_decoded_pixels: int = Field(
        64 * 1024 * 1024, ge=1, description="Images or frames larger than this before resizing are refused."
    )

    @model_validator(mode="after")
    def _check(self) -> VisionSpec:
        problems = Problems("VisionSpec")
        factor = self.patch_size * self.merge_size
        for low, high in (("min_pixels", "max_pixels"), ("video_min_pixels", "video_max_pixels")):
            if getattr(self, high) < getattr(self, low):
                problems.add((high,), f"must be at least {low} ({getattr(self, low)})", getattr(self, high))
            if getattr(self, high) < factor * factor:
                problems.add(
                    (high,), f"must hold one (patch_size * merge_size)^2 = {factor * factor} block", getattr(self, high)
                )
        if self.video_max_frames < self.temporal_patch_size:
            problems.add(
                ("video_max_frames",),
                f"must be at least temporal_patch_size ({self.temporal_patch_size})",
                self.video_max_frames,
            )
        ids = {"image_token_id", "video_token_id", "vision_start_id", "vision_end_id"}
        values = [getattr(self, name) for name in sorted(ids)]
        if len(set(values)) < len(values):
            problems.add(("image_token_id",), "the four vision token ids must differ", values)
        problems.raise_if_any()
        return self


FieldNames = str | list[str]


class MediaFieldsSpec(BaseModel):
    """Where a multimodal source's records hold their text and media: keys (JSONL) or columns (Parquet,
    Arrow), each a name or a list of names tried in order. Unset: the readers' defaults, after Hugging Face
    ``datasets`` and LLaVA (``text``/``caption``, ``image``/``images``, ``video``/``videos``, ``segments``,
    ``conversations``/``messages``, ``texts``)."""

    model_config = ConfigDict(extra="forbid")

    text: FieldNames | None = Field(None, description="The caption or text of an image-text or video-text pair.")
    image: FieldNames | None = Field(None, description="An image (bytes, a {bytes, path} struct or a path), or a list.")
    video: FieldNames | None = Field(None, description="A clip (bytes or a path), or a list.")
    segments: FieldNames | None = Field(
        None, description="An interleaved document: a list of {text: ...}, {image: ...} or {video: ...}."
    )
    conversations: FieldNames | None = Field(
        None, description="A conversation: a list of {from, value} (LLaVA, ShareGPT) or {role, content} turns."
    )
    texts: FieldNames | None = Field(
        None, description="OBELICS' texts: a list as long as the images list, null where an image stands."
    )

    def given(self) -> dict[str, tuple[str, ...]]:
        """The names given, as tuples, by field: what ``connectors.readers.MediaFields`` takes."""
        return {
            name: (value,) if isinstance(value, str) else tuple(value)
            for name, value in self.model_dump().items()
            if value is not None
        }
