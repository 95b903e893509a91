"""A media item's frames as pixels and back: raw uint8 RGB, or each frame a JPEG or PNG (Pillow)."""

from __future__ import annotations

import io

import numpy as np

from topics.errors import DecodeError
from topics.formats.media import CHANNELS, MediaItem, PixelEncoding


def encode_frames(frames: np.ndarray, encoding: PixelEncoding, *, jpeg_quality: int = 90) -> tuple[bytes, ...]:
    """``frames`` (uint8 ``[n, height, width, 3]``) as one ``bytes`` per frame in ``encoding``."""
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != CHANNELS:
        msg = f"frames must be uint8 [n, height, width, {CHANNELS}], got {frames.dtype} {frames.shape}"
        raise ValueError(msg)
    if encoding == "raw":
        return tuple(np.ascontiguousarray(frame).tobytes() for frame in frames)
    from PIL import Image

    options = {"quality": jpeg_quality} if encoding == "jpeg" else {"compress_level": 1}
    encoded = []
    for frame in frames:
        out = io.BytesIO()
        Image.fromarray(frame, "RGB").save(out, format=encoding.upper(), **options)
        encoded.append(out.getvalue())
    return tuple(encoded)


def frames_array(item: MediaItem) -> np.ndarray:
    """The item's frames, uint8 ``[frames, height, width, 3]`` (an image: one frame). ``DecodeError`` when a
    frame does not decode to the item's size."""
    shape = (item.height, item.width, CHANNELS)
    if item.encoding == "raw":
        joined = b"".join(item.frames)
        if len(joined) != len(item.frames) * item.height * item.width * CHANNELS:
            msg = f"raw {item.kind} frames hold {len(joined)} bytes, not {len(item.frames)} x {shape}"
            raise DecodeError(msg)
        return np.frombuffer(joined, np.uint8).reshape(len(item.frames), *shape)
    from PIL import Image

    out = np.empty((len(item.frames), *shape), np.uint8)
    for k, data in enumerate(item.frames):
        try:
            with Image.open(io.BytesIO(data)) as image:
                frame = np.asarray(image.convert("RGB"))
        except Exception as exc:  # Pillow raises OSError, SyntaxError, ValueError ... on bad data
            msg = f"{item.encoding} frame {k} of a {item.kind} does not decode: {exc}"
            raise DecodeError(msg) from exc
        if frame.shape != shape:
            msg = f"{item.encoding} frame {k} of a {item.kind} is {frame.shape}, not {shape}"
            raise DecodeError(msg)
        out[k] = frame
    return out
