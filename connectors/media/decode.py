"""A media reference to a media item, by its kind: the one entry point the sample builder calls."""

from __future__ import annotations

from pathlib import Path

from connectors.media.config import VisionConfig
from connectors.media.refs import media_input
from connectors.readers.base import MediaRef
from connectors.storage import Storage
from topics.formats.media import MediaItem


class MediaDecoder:
    """Decodes images (Pillow) and clips (PyAV) per ``config``; path references are files under ``root``
    (a folder, or an object store's ``Storage``).

    The decoders' modules load on the first image or clip, so a text source never imports Pillow or PyAV."""

    def __init__(self, config: VisionConfig, root: str | Path | Storage | None = None) -> None:
        self.config = config
        self.root = root if isinstance(root, Storage) or root is None else Path(root).resolve()

    def decode(self, ref: MediaRef) -> MediaItem:
        """``ref`` decoded and resized, ``token_offset`` 0; ``MediaError`` saying why it cannot be."""
        source = media_input(ref, self.root)
        if ref.kind == "image":
            from connectors.media.image import decode_image

            return decode_image(source, self.config)
        from connectors.media.video import decode_video

        return decode_video(source, self.config)

    def grid(self, ref: MediaRef) -> tuple[int, int, int]:
        """The patch grid ``(t, h, w)`` that ``decode`` gives ``ref``, read from its header (an image) or its
        packets' times (a clip) without decoding a pixel; ``MediaError`` where ``decode`` would refuse it."""
        source = media_input(ref, self.root)
        if ref.kind == "image":
            from connectors.media.image import image_grid

            return image_grid(source, self.config)
        from connectors.media.video import video_grid

        return video_grid(source, self.config)
