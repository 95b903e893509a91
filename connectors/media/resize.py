"""Qwen2-VL's "smart resize": the size an image or a clip's frames are resized to before patching."""

from __future__ import annotations

import math

from connectors.media.errors import MediaError

MAX_ASPECT_RATIO = 200
"""The longest side may be at most this many times the shortest (Qwen2-VL refuses more)."""


def smart_resize(height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """``(height, width)`` resized as Qwen2-VL's image processor does (``transformers``' ``smart_resize``).

    Each side is rounded to the nearest multiple of ``factor``. When that makes more than ``max_pixels``,
    both sides are scaled by one factor so that the area is ``max_pixels`` and rounded down (never below
    ``factor``); when it makes fewer than ``min_pixels``, scaled to ``min_pixels`` and rounded up. The
    aspect ratio is kept to within one ``factor`` step per side, and the area ends within
    ``[min_pixels, max_pixels]`` whenever ``max_pixels >= (sqrt(min_pixels) + 15 * factor) ** 2`` (the
    rounding needs that room; Qwen2-VL's defaults have it). ``MediaError`` for a side of 0 or an aspect
    ratio over ``MAX_ASPECT_RATIO``; ``ValueError`` for bounds that are not ``1 <= min <= max``.
    """
    if factor < 1 or not 1 <= min_pixels <= max_pixels:
        bounds = f"factor {factor}, min_pixels {min_pixels}, max_pixels {max_pixels}"
        msg = f"smart_resize needs factor >= 1 and 1 <= min_pixels <= max_pixels, got {bounds}"
        raise ValueError(msg)
    if height < 1 or width < 1:
        raise MediaError(f"a side of {height}x{width} pixels is 0 (or negative): nothing to resize")
    if max(height, width) > MAX_ASPECT_RATIO * min(height, width):
        ratio = max(height, width) / min(height, width)
        raise MediaError(f"{height}x{width} pixels has an aspect ratio of {ratio:.1f}, more than {MAX_ASPECT_RATIO}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar
