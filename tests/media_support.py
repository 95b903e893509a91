"""Test media made here: images Pillow renders, clips PyAV encodes, and the broken files a source may hold."""

from __future__ import annotations

import io
import struct
import zlib

import av
import numpy as np
from PIL import Image, ImageDraw

from connectors.media.config import VisionConfig

VISION = VisionConfig(
    image_token_id=250,
    video_token_id=251,
    vision_start_id=252,
    vision_end_id=253,
    video_min_pixels=56 * 56,
    video_max_pixels=28 * 28 * 1280,
    encoding="raw",
)
"""Qwen2-VL's defaults (patch 14, merge 2, temporal patch 2), token ids inside a small test vocabulary, raw
pixels, and a clip's frames in the image bounds."""


def text_image(width: int, height: int, text: str = "mixflow", *, mode: str = "RGB") -> Image.Image:
    """An image with ``text`` drawn on a coloured background, in ``mode``."""
    image = Image.new("RGB", (width, height), (40, 90, 160))
    ImageDraw.Draw(image).text((2, 2), text, fill=(250, 240, 30))
    return image if mode == "RGB" else image.convert(mode)


def image_bytes(image: Image.Image, fmt: str = "PNG", **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def frame_pattern(index: int, width: int, height: int) -> np.ndarray:
    """Frame ``index`` of a test clip: a gray level per frame (index * 8 + 8), so a decoded frame tells
    which source frame it was."""
    return np.full((height, width, 3), index * 8 + 8, np.uint8)


def clip_bytes(
    frames: int,
    *,
    rate: int = 10,
    width: int = 64,
    height: int = 48,
    fmt: str = "matroska",
    codec: str = "ffv1",
) -> bytes:
    """A clip of ``frames`` frames at ``rate`` frames per second (frame k: ``frame_pattern(k)``). The
    default, FFV1 in Matroska, is lossless: the gray levels come back exactly."""
    out = io.BytesIO()
    with av.open(out, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p" if codec != "ffv1" else "bgr0"
        for k in range(frames):
            frame = av.VideoFrame.from_ndarray(frame_pattern(k, width, height), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return out.getvalue()


def audio_bytes(seconds: float = 0.2, rate: int = 8000) -> bytes:
    """A WAV file of silence: a container with no video stream."""
    out = io.BytesIO()
    with av.open(out, "w", format="wav") as container:
        stream = container.add_stream("pcm_s16le", rate=rate)
        samples = int(seconds * rate)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, samples), np.int16), format="s16", layout="mono")
        frame.sample_rate = rate
        container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return out.getvalue()


def unknown_codec_clip() -> bytes:
    """A Matroska clip whose codec id names no codec FFmpeg knows (``V_FFV1`` renamed ``V_ZZZZ``)."""
    data = clip_bytes(4)
    assert data.count(b"V_FFV1") == 1
    return data.replace(b"V_FFV1", b"V_ZZZZ")


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_with_header(width: int, height: int) -> bytes:
    """A PNG whose header says ``width x height`` but whose data holds one row: a decompression bomb's
    shape, or a zero-sized image."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(b"\x00" * (1 + 3 * max(width, 1))))
        + _png_chunk(b"IEND", b"")
    )


PNG_COLOUR_TYPES = {1: 0, 3: 2, 2: 4, 4: 6}
"""The PNG colour type of each channel count: grey, RGB, grey and alpha, RGBA."""


def sixteen_bit_channels_png(samples: np.ndarray, transparency: tuple[int, ...] | None = None) -> bytes:
    """A PNG of 16 bits a sample (of these Pillow writes only greyscale): ``samples`` uint16 ``[height, width,
    channels]`` (1 grey, 2 grey and alpha, 3 RGB, 4 RGBA), with a ``tRNS`` colour key ``transparency`` (one
    value a channel, grey or RGB only) when given."""
    height, width, channels = samples.shape
    header = struct.pack(">IIBBBBB", width, height, 16, PNG_COLOUR_TYPES[channels], 0, 0, 0)
    rows = b"".join(b"\x00" + row.tobytes() for row in samples.astype(">u2").reshape(height, -1))  # filter 0
    key = b"" if transparency is None else _png_chunk(b"tRNS", struct.pack(f">{len(transparency)}H", *transparency))
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + key
        + _png_chunk(b"IDAT", zlib.compress(rows))
        + _png_chunk(b"IEND", b"")
    )


def png_with_orientation(data: bytes, orientation: int) -> bytes:
    """The PNG ``data`` with an ``eXIf`` chunk holding the EXIF ``orientation``, its pixels and other chunks as
    they are (the chunk follows the 33 bytes of signature and ``IHDR``)."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    tiff = exif.tobytes().removeprefix(b"Exif\x00\x00")
    return data[:33] + _png_chunk(b"eXIf", tiff) + data[33:]


def sixteen_bit_png(values: np.ndarray) -> bytes:
    """A 16-bit grayscale PNG of ``values`` (uint16 ``[height, width]``)."""
    return image_bytes(Image.fromarray(values.astype(np.uint16)))


def exif_rotated_jpeg(width: int, height: int, orientation: int) -> bytes:
    """A JPEG stored ``width x height`` with a red top-left corner and an EXIF orientation tag."""
    image = Image.new("RGB", (width, height), (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, width // 4, height // 4))
    exif = Image.Exif()
    exif[0x0112] = orientation
    return image_bytes(image, "JPEG", quality=95, exif=exif.tobytes())


def empty_clip() -> bytes:
    """An AVI file with an MPEG-4 video stream and no frame in it."""
    out = io.BytesIO()
    with av.open(out, "w", format="avi") as container:
        stream = container.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        container.start_encoding()
    return out.getvalue()
