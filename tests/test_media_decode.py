"""Media decoding: Qwen2-VL's smart resize, images with Pillow, clips with PyAV and their frame sampling, and every
bad input as a ``MediaError`` that says what is wrong."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from connectors.media.config import VisionConfig
from connectors.media.decode import MediaDecoder
from connectors.media.errors import MediaError
from connectors.media.frame_sampling import clip_span, padded_count, pick_frames, sample_times
from connectors.media.resize import smart_resize
from connectors.readers.base import MediaRef
from tests.media_support import (
    VISION,
    audio_bytes,
    clip_bytes,
    empty_clip,
    exif_rotated_jpeg,
    frame_pattern,
    image_bytes,
    png_with_header,
    sixteen_bit_png,
    text_image,
    unknown_codec_clip,
)
from topics.errors import MixflowError
from topics.formats.media import MediaItem
from topics.formats.media_pixels import frames_array

QWEN = {"factor": 28, "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280}


def reference_smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's formula as transformers 5.x writes it (``image_processing_qwen2_vl.smart_resize``)."""
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        return max(factor, math.floor(height / beta / factor) * factor), max(
            factor, math.floor(width / beta / factor) * factor
        )
    if h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        return math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@st.composite
def sides(draw: st.DrawFn, longest: int = 20_000) -> tuple[int, int]:
    """A height and width whose aspect ratio is at most 200."""
    short = draw(st.integers(1, longest // 2))
    long = draw(st.integers(short, min(longest, 200 * short)))
    return (short, long) if draw(st.booleans()) else (long, short)


@st.composite
def roomy_bounds(draw: st.DrawFn) -> dict[str, int]:
    """A factor and pixel bounds far enough apart for rounding: ``max >= (sqrt(min) + 15 factor)^2``."""
    factor = draw(st.sampled_from([14, 16, 28, 32]))
    min_pixels = draw(st.integers(1, 400_000))
    floor = math.ceil((math.sqrt(min_pixels) + 15 * factor) ** 2)
    return {"factor": factor, "min_pixels": min_pixels, "max_pixels": draw(st.integers(floor, floor + 4_000_000))}


@given(sides(), roomy_bounds())
def test_smart_resize_keeps_multiples_bounds_and_aspect(size: tuple[int, int], bounds: dict[str, int]) -> None:
    height, width = size
    h_bar, w_bar = smart_resize(height, width, **bounds)
    factor = bounds["factor"]
    assert h_bar % factor == 0 and w_bar % factor == 0 and h_bar >= factor and w_bar >= factor
    assert bounds["min_pixels"] <= h_bar * w_bar <= bounds["max_pixels"]
    # One scale s takes both sides to within one factor step of the result.
    low = max((h_bar - factor) / height, (w_bar - factor) / width)
    high = min((h_bar + factor) / height, (w_bar + factor) / width)
    assert low <= high + 1e-12, f"{height}x{width} -> {h_bar}x{w_bar} does not keep the aspect ratio"


@given(sides(), st.sampled_from([14, 28]), st.integers(1, 10**6), st.integers(0, 10**7))
def test_smart_resize_is_qwen2_vls_formula(size: tuple[int, int], factor: int, low: int, extra: int) -> None:
    bounds = {"factor": factor, "min_pixels": low, "max_pixels": low + extra}
    h_bar, w_bar = smart_resize(*size, **bounds)
    assert (h_bar, w_bar) == reference_smart_resize(*size, **bounds)
    assert h_bar % factor == 0 and w_bar % factor == 0


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        ((600, 512), (588, 504)),  # rounded to the nearest multiple of 28
        ((10, 10), (56, 56)),  # scaled up to min_pixels
        ((70, 70), (56, 56)),  # round() rounds 2.5 to even
        ((4000, 3000), (1148, 840)),  # scaled down to max_pixels, floor
        ((1080, 1920), (728, 1316)),
        ((5600, 28), (5600, 28)),  # the widest aspect ratio allowed
        ((2000, 11), (756, 28)),
    ],
)
def test_smart_resize_known_values(size: tuple[int, int], expected: tuple[int, int]) -> None:
    assert smart_resize(*size, **QWEN) == expected == reference_smart_resize(*size, **QWEN)


def test_smart_resize_refuses_zero_sides_and_extreme_aspect_ratios() -> None:
    with pytest.raises(MediaError, match="a side of 0x5 pixels is 0"):
        smart_resize(0, 5, **QWEN)
    with pytest.raises(MediaError, match=r"aspect ratio of 201\.0, more than 200"):
        smart_resize(10, 2010, **QWEN)
    with pytest.raises(ValueError, match="1 <= min_pixels <= max_pixels"):
        smart_resize(10, 10, factor=28, min_pixels=100, max_pixels=99)
    assert issubclass(MediaError, MixflowError)


def decode(kind: str, data: bytes, config: VisionConfig = VISION) -> MediaItem:
    return MediaDecoder(config).decode(MediaRef(kind, "test:item", data=data))


# Images


@settings(max_examples=30)
@given(sides(longest=700), st.sampled_from(["PNG", "JPEG"]))
def test_image_grid_and_tokens_over_sizes(size: tuple[int, int], fmt: str) -> None:
    height, width = size
    item = decode("image", image_bytes(text_image(width, height), fmt))
    expected = smart_resize(
        height, width, factor=VISION.factor, min_pixels=VISION.min_pixels, max_pixels=VISION.max_pixels
    )
    assert (item.height, item.width) == expected
    assert item.grid == (1, expected[0] // 14, expected[1] // 14)
    assert item.tokens == item.grid_h * item.grid_w // 4 == expected[0] * expected[1] // 28**2
    assert (item.kind, item.token_offset, item.encoding, item.temporal_patch_size) == ("image", 0, "raw", 2)
    item.check()
    assert frames_array(item).shape == (1, *expected, 3)


def _centre(data: bytes) -> tuple[int, ...]:
    pixels = frames_array(decode("image", data))[0]
    return tuple(int(v) for v in pixels[pixels.shape[0] // 2, pixels.shape[1] // 2])


def _paletted_with_transparency() -> bytes:
    image = Image.new("P", (60, 60), 1)
    image.putpalette([0, 0, 0, 200, 30, 30] + [0] * 762)
    return image_bytes(image, transparency=1)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (image_bytes(Image.new("RGBA", (60, 60), (10, 20, 30, 0))), (255, 255, 255)),  # transparent: white
        (image_bytes(Image.new("RGBA", (60, 60), (255, 0, 0, 128))), (255, 127, 127)),
        (image_bytes(Image.new("LA", (60, 60), (0, 0))), (255, 255, 255)),
        (_paletted_with_transparency(), (255, 255, 255)),
        (
            image_bytes(Image.new("RGB", (60, 60), (200, 30, 30)).convert("P", palette=Image.Palette.ADAPTIVE)),
            (200, 30, 30),
        ),
        (image_bytes(Image.new("CMYK", (60, 60), (0, 255, 0, 0)), "TIFF"), (255, 0, 255)),
        (image_bytes(Image.new("L", (60, 60), 77)), (77, 77, 77)),
        (image_bytes(Image.new("1", (60, 60), 1)), (255, 255, 255)),
        (sixteen_bit_png(np.full((60, 60), 65535)), (255, 255, 255)),
        (sixteen_bit_png(np.full((60, 60), 32896)), (255, 255, 255)),  # clipped at 255, as transformers does
        (sixteen_bit_png(np.full((60, 60), 77)), (77, 77, 77)),
        (image_bytes(Image.new("RGB", (60, 60), (1, 1, 1)), transparency=(1, 1, 1)), (255, 255, 255)),  # tRNS key
        (image_bytes(Image.new("RGB", (60, 60), (1, 2, 3)), "WEBP", lossless=True), (1, 2, 3)),
    ],
    ids=[
        "rgba-clear",
        "rgba-half",
        "la",
        "palette-clear",
        "palette",
        "cmyk",
        "l",
        "1-bit",
        "16-bit",
        "16-bit-mid",
        "16-bit-low",
        "rgb-colour-key",
        "webp",
    ],
)
def test_image_modes_become_rgb(data: bytes, expected: tuple[int, int, int]) -> None:
    assert all(abs(a - b) <= 1 for a, b in zip(_centre(data), expected, strict=True)), _centre(data)


@pytest.mark.parametrize(("orientation", "red_corner"), [(1, "top-left"), (6, "top-right"), (3, "bottom-right")])
def test_exif_orientation_is_applied(orientation: int, red_corner: str) -> None:
    item = decode("image", exif_rotated_jpeg(224, 112, orientation))
    upright = (112, 224) if orientation in (1, 3) else (224, 112)  # (height, width) as meant to be seen
    assert (item.height, item.width) == upright
    pixels = frames_array(item)[0].astype(int)
    corners = {"top-left": pixels[5, 5], "top-right": pixels[5, -6], "bottom-right": pixels[-6, -6]}
    reds = [name for name, (r, g, b) in corners.items() if r > 200 and b < 60]
    assert reds == [red_corner]


@pytest.mark.parametrize("encoding", ["raw", "png", "jpeg"])
def test_pixel_encodings_give_the_same_pixels_back(encoding: str) -> None:
    data = image_bytes(text_image(300, 200, "encodings"))
    raw = frames_array(decode("image", data)).astype(int)
    item = decode("image", data, replace(VISION, encoding=encoding))
    assert item.encoding == encoding
    back = frames_array(item).astype(int)
    assert back.shape == raw.shape
    assert np.abs(back - raw).mean() < (4 if encoding == "jpeg" else 1e-9)


def _truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _corrupt_header(data: bytes) -> bytes:
    return data[:8] + bytes(32) + data[40:]


BAD_IMAGES = [
    ("garbage", b"this is not an image at all" * 4, "not an image Pillow can read"),
    ("corrupt-header", _corrupt_header(image_bytes(text_image(80, 60))), "not an image Pillow can read"),
    ("truncated-jpeg", _truncated(image_bytes(text_image(300, 200), "JPEG")), "truncated"),
    ("truncated-png", _truncated(image_bytes(text_image(300, 200))), "truncated"),
    ("empty", b"", r"empty \(0 bytes\)"),
    ("zero-width", png_with_header(0, 10), "zero-sized header"),
    ("huge-header", png_with_header(9000, 9000), "9000x9000 = 81000000 pixels, more than max_decoded_pixels"),
    ("absurd-header", png_with_header(100_000, 100_000), "too large to decode safely"),
    ("aspect-ratio", image_bytes(Image.new("RGB", (2010, 10))), "aspect ratio of 201.0"),
]


@pytest.mark.parametrize(("data", "reason"), [case[1:] for case in BAD_IMAGES], ids=[case[0] for case in BAD_IMAGES])
def test_bad_images_are_media_errors_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(MediaError, match=reason):
        decode("image", data)


def test_image_files_under_the_source_root(tmp_path: Path) -> None:
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(image_bytes(text_image(90, 60)))
    (tmp_path / "imgs" / "empty.png").write_bytes(b"")
    (tmp_path.parent / "outside.png").write_bytes(image_bytes(text_image(90, 60)))
    decoder = MediaDecoder(VISION, tmp_path)
    assert decoder.decode(MediaRef("image", "a", path="imgs/a.png")).grid == (1, 4, 6)
    cases = [
        ("imgs/missing.png", "does not exist under the source root"),
        ("imgs/empty.png", r"empty \(0 bytes\)"),
        ("../outside.png", "leads outside the source root"),
        (str(tmp_path / "imgs" / "a.png"), "is absolute"),
    ]
    for path, reason in cases:
        with pytest.raises(MediaError, match=reason):
            decoder.decode(MediaRef("image", "a", path=path))
    with pytest.raises(ValueError, match="no source root is configured"):
        MediaDecoder(VISION).decode(MediaRef("image", "a", path="imgs/a.png"))


def test_max_decoded_pixels_is_the_configured_bound() -> None:
    with pytest.raises(MediaError, match="300x200 = 60000 pixels, more than max_decoded_pixels 59999"):
        decode("image", image_bytes(text_image(300, 200)), replace(VISION, max_decoded_pixels=59_999))


# Frame sampling (pure)


@given(
    st.floats(0, 100),
    st.floats(0, 600),
    st.floats(0.1, 30),
    st.integers(1, 64),
    st.integers(1, 4),
)
def test_sample_times_rate_cap_and_span(start: float, duration: float, fps: float, max_frames: int, tps: int) -> None:
    if max_frames < tps:
        with pytest.raises(ValueError, match="holds no multiple"):
            sample_times(start, duration, fps=fps, max_frames=max_frames, temporal_patch_size=tps)
        return
    times = sample_times(start, duration, fps=fps, max_frames=max_frames, temporal_patch_size=tps)
    cap = max_frames // tps * tps
    assert 1 <= len(times) <= cap
    assert times[0] == start and np.all(np.diff(times) >= 0)
    assert times[-1] < start + max(duration, 1e-9) or len(times) == 1
    if len(times) < cap:  # not capped: every 1/fps seconds, as many as the clip holds
        assert np.allclose(np.diff(times), 1 / fps)
        assert len(times) == max(1, math.ceil(duration * fps - 1e-6))
    count = padded_count(len(times), tps)
    assert count % tps == 0 and len(times) <= count < len(times) + tps and count <= cap


@given(st.lists(st.floats(0, 50), min_size=1, max_size=60), st.lists(st.floats(-1, 55), min_size=1, max_size=20))
def test_pick_frames_takes_the_frame_on_screen(frame_times: list[float], targets: list[float]) -> None:
    frame_times, targets = sorted(frame_times), sorted(targets)
    picked = pick_frames(frame_times, targets)
    on_screen = np.searchsorted(np.array(frame_times) - 1e-6, targets, side="right") - 1
    assert picked == np.maximum(on_screen, 0).tolist()


def test_clip_span_counts_the_last_frame() -> None:
    assert clip_span(np.array([1.0, 1.5, 1.25, 1.75])) == (1.0, 1.0)
    assert clip_span(np.array([3.0])) == (3.0, 0.0)


# Clips


@settings(max_examples=20)
@given(
    st.integers(1, 30),
    st.sampled_from([4, 10, 25]),
    st.sampled_from([1.0, 2.0, 4.0]),
    st.integers(2, 16),
)
def test_clip_frames_are_sampled_by_time(frames: int, rate: int, fps: float, max_frames: int) -> None:
    config = replace(VISION, video_fps=fps, video_max_frames=max_frames)
    item = decode("video", clip_bytes(frames, rate=rate), config)
    times = np.arange(frames) / rate
    start, duration = clip_span(times)
    targets = sample_times(start, duration, fps=fps, max_frames=max_frames, temporal_patch_size=2)
    expected = pick_frames(times, targets)
    expected += [expected[-1]] * (padded_count(len(expected), 2) - len(expected))
    item.check()
    assert item.kind == "video" and item.grid == (len(expected) // 2, 4, 4) and (item.height, item.width) == (56, 56)
    assert item.tokens == item.grid_t * 4
    levels = frames_array(item)[:, 28, 28, 0]
    assert levels.tolist() == [frame_pattern(k, 1, 1)[0, 0, 0] for k in expected]


@pytest.mark.parametrize(("fmt", "codec"), [("mp4", "libx264"), ("mp4", "mpeg4"), ("webm", "libvpx-vp9")])
def test_clips_in_common_codecs(fmt: str, codec: str) -> None:
    item = decode("video", clip_bytes(25, rate=10, width=320, height=240, fmt=fmt, codec=codec))
    assert item.grid == (3, 18, 22) and (item.height, item.width) == (252, 308)
    assert len(item.frames) == 6


BAD_CLIPS = [
    ("unsupported-codec", unknown_codec_clip(), "has no decoder in this FFmpeg build"),
    ("no-video-stream", audio_bytes(), r"no video stream in the wav file \(it holds audio\)"),
    ("zero-frames", empty_clip(), "holds no frames"),
    ("garbage", b"definitely not a video " * 20, "not a video FFmpeg can read"),
    ("truncated-mp4", _truncated(clip_bytes(20, fmt="mp4", codec="mpeg4")), "not a video FFmpeg can read"),
    ("image-as-video", image_bytes(text_image(64, 48)), r"a still image \(png_pipe\), not a video"),
    ("jpeg-as-video", image_bytes(text_image(64, 48), "JPEG"), r"a still image \(jpeg_pipe\), not a video"),
    ("empty", b"", r"empty \(0 bytes\)"),
]


@pytest.mark.parametrize(("data", "reason"), [case[1:] for case in BAD_CLIPS], ids=[case[0] for case in BAD_CLIPS])
def test_bad_clips_are_media_errors_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(MediaError, match=reason):
        decode("video", data)


def test_clip_files_and_frame_size_bound(tmp_path: Path) -> None:
    (tmp_path / "c.mkv").write_bytes(clip_bytes(8))
    decoder = MediaDecoder(VISION, tmp_path)
    assert decoder.decode(MediaRef("video", "c", path="c.mkv")).grid_t == 1
    with pytest.raises(MediaError, match="does not exist"):
        decoder.decode(MediaRef("video", "c", path="nope.mp4"))
    with pytest.raises(MediaError, match="64x48 = 3072 pixels, more than max_decoded_pixels 3000"):
        decode("video", clip_bytes(4), replace(VISION, max_decoded_pixels=3000))


# The grid from headers alone: what `spec check --files` measures without decoding


@settings(max_examples=25)
@given(sides(longest=900), st.sampled_from(["PNG", "JPEG", "WEBP"]), st.sampled_from([1, 3, 5, 6, 8]))
def test_an_image_grid_read_from_its_header_is_the_decoded_one(
    size: tuple[int, int], fmt: str, orientation: int
) -> None:
    height, width = size
    if fmt == "JPEG":
        data = exif_rotated_jpeg(width, height, orientation)
    else:
        data = image_bytes(text_image(width, height), fmt)
    ref = MediaRef("image", "test:item", data=data)
    assert MediaDecoder(VISION).grid(ref) == decode("image", data).grid


@settings(max_examples=12)
@given(
    st.integers(1, 30),
    st.sampled_from([4, 10, 25]),
    st.sampled_from([1.0, 2.0, 4.0]),
    st.integers(2, 16),
    st.sampled_from([(64, 48, "matroska", "ffv1"), (320, 240, "mp4", "mpeg4")]),
)
def test_a_clip_grid_read_from_its_packets_is_the_decoded_one(
    frames: int, rate: int, fps: float, max_frames: int, shape: tuple[int, int, str, str]
) -> None:
    width, height, fmt, codec = shape
    config = replace(VISION, video_fps=fps, video_max_frames=max_frames)
    data = clip_bytes(frames, rate=rate, width=width, height=height, fmt=fmt, codec=codec)
    ref = MediaRef("video", "test:item", data=data)
    assert MediaDecoder(config).grid(ref) == decode("video", data, config).grid


@pytest.mark.parametrize(("kind", "data"), [*(("video", data) for _, data, _ in BAD_CLIPS), ("image", b"no image")])
def test_a_grid_that_cannot_be_read_is_a_media_error(kind: str, data: bytes) -> None:
    with pytest.raises(MediaError):
        MediaDecoder(VISION).grid(MediaRef(kind, "test:item", data=data))
