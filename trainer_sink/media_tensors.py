"""A micro-batch's vision inputs as tensors, beside its token tensors (``trainer_sink.tensors``), for a job with
media. Pure: no Kafka, no threads; the reader's thread runs it, so frames are decoded and normalized there.

| key | type | meaning |
|---|---|---|
| ``pixel_values`` | float32 [image patches, D] | the images' patches, normalized, in Qwen2-VL's order; |
|  |  | ``D = 3 * temporal_patch_size * patch_size**2`` |
| ``image_grid_thw`` | int64 [images, 3] | each image's patch grid (1, h, w) |
| ``image_cu_seqlens`` | int32 [images + 1] | the vision encoder's attention blocks over ``pixel_values`` |
| ``pixel_values_videos`` | float32 [clip patches, same] | the clips' patches |
| ``video_grid_thw`` | int64 [clips, 3] | each clip's patch grid (t, h, w) |
| ``video_cu_seqlens`` | int32 [sum of t + 1] | one block of ``h * w`` patches per temporal patch of each clip |
| ``mm_token_type_ids`` | int32 [T] | 0 text, 1 an image's placeholder token, 2 a clip's |
| ``mrope_position_ids`` | int32 [3, T] | each sample's 3-D rotary positions (temporal, height, width), as if alone |

``trainer_sink/vlm/qwen2_vl.py`` says how each is made. Both layouts have every key; the token-aligned ones follow
the layout (padding: type 0, positions as ``position_ids`` pads them); the vision ones are never padded.
Qwen2-VL (transformers 5.x) takes a packed micro-batch as ``input_ids[None]``, ``pixel_values``,
``image_grid_thw``, ``pixel_values_videos``, ``video_grid_thw`` and
``position_ids=torch.cat([position_ids[None], mrope_position_ids])[:, None]`` (4 rows: the text positions
first, from which it finds where each sample starts and keeps attention within it), without an attention
mask.
"""

from __future__ import annotations

import numpy as np
import torch

from trainer_sink.vlm.qwen2_vl import TEXT, PackedMedia

VISION_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "image_cu_seqlens",
    "pixel_values_videos",
    "video_grid_thw",
    "video_cu_seqlens",
)


def media_tensors(packed: PackedMedia, padding: int, padded_to: int | None) -> dict[str, torch.Tensor]:
    """``packed`` as tensors; ``padding`` tokens after the micro-batch's own (the packed layout's padding
    segment), or with ``padded_to`` the token-aligned ones padded to that many (the padded layout)."""
    tensors = {key: torch.from_numpy(getattr(packed, key)) for key in VISION_KEYS}
    types, positions = packed.mm_token_type_ids, packed.mrope_position_ids
    tokens = types.size
    if padded_to is not None:
        padded_types = np.full(padded_to, TEXT, np.int32)
        padded_types[:tokens] = types
        padded_positions = np.zeros((3, padded_to), np.int32)
        padded_positions[:, :tokens] = positions
        types, positions = padded_types, padded_positions
    elif padding:
        types = np.concatenate([types, np.full(padding, TEXT, np.int32)])
        segment = np.broadcast_to(np.arange(padding, dtype=np.int32), (3, padding))
        positions = np.concatenate([positions, segment], axis=1)
    tensors["mm_token_type_ids"] = torch.from_numpy(np.ascontiguousarray(types))
    tensors["mrope_position_ids"] = torch.from_numpy(np.ascontiguousarray(positions))
    return tensors
