"""The tokens that stand for a media item in the LLM's sequence (Qwen2-VL): start, placeholders, end."""

from __future__ import annotations

import numpy as np

from connectors.media.config import VisionConfig
from topics.formats.media import MediaItem


def placeholder_block(item: MediaItem, config: VisionConfig) -> np.ndarray:
    """``vision_start_id``, ``item.tokens`` copies of ``image_token_id`` (``video_token_id`` for a clip),
    ``vision_end_id``: int32. The first placeholder is at index 1."""
    block = np.full(item.tokens + 2, config.image_token_id if item.kind == "image" else config.video_token_id, np.int32)
    block[0], block[-1] = config.vision_start_id, config.vision_end_id
    return block


def block_length(item: MediaItem) -> int:
    """Tokens the item's block takes: its placeholders and the start and end tokens."""
    return item.tokens + 2
