"""Clips with PyAV: frames sampled at the configured rate by their timestamps, resized to one smart size."""

from __future__ import annotations

import io
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from connectors.media.config import VisionConfig
from connectors.media.errors import MediaError
from connectors.media.frame_sampling import FramePicker, clip_span, padded_count, sample_times
from connectors.media.resize import smart_resize
from topics.formats.media import MediaItem

_FALLBACK_RATE = Fraction(25)  # frames per second of a stream that states none and has no timestamps


def decode_video(source: io.BytesIO | Path, config: VisionConfig) -> MediaItem:
    """One clip as a ``MediaItem`` (``token_offset`` 0): frames every ``1 / video_fps`` seconds by their
    timestamps (at most ``video_max_frames``, spread over the clip when it is longer), the count padded to
    a multiple of ``temporal_patch_size`` by repeating the last, each frame resized with BICUBIC to the
    ``smart_resize`` of the first. ``MediaError`` for a file FFmpeg cannot read, no video stream, a still
    image, a codec this FFmpeg build cannot decode, frames over ``max_decoded_pixels``, or no frames."""
    try:
        container = av.open(source if isinstance(source, io.BytesIO) else str(source), mode="r")
    except Exception as exc:  # PyAV raises InvalidDataError, OSError, ValueError ... for what is not media
        raise MediaError(f"not a video FFmpeg can read: {_reason(exc)}") from exc
    with container:
        stream = _video_stream(container, config)
        try:
            packets = [packet for packet in container.demux(stream) if packet.size]
            frames = _sampled_frames(stream, packets, config)
        except MediaError:
            raise
        except Exception as exc:  # FFmpeg errors while demuxing or decoding: a corrupt or truncated file
            raise MediaError(f"the video does not decode: {type(exc).__name__}: {_reason(exc)}") from exc
    count = padded_count(len(frames), config.temporal_patch_size)
    pixels = np.stack(frames + [frames[-1]] * (count - len(frames)))
    return config.item("video", pixels)


def video_grid(source: io.BytesIO | Path, config: VisionConfig) -> tuple[int, int, int]:
    """The patch grid ``(t, h, w)`` that ``decode_video`` gives ``source``, from its stream's frame size and its
    packets' times (demuxed, not decoded). ``MediaError`` for a file that is no clip, as ``decode_video``."""
    try:
        container = av.open(source if isinstance(source, io.BytesIO) else str(source), mode="r")
    except Exception as exc:  # as in decode_video
        raise MediaError(f"not a video FFmpeg can read: {_reason(exc)}") from exc
    with container:
        stream = _video_stream(container, config)
        try:
            packets = [packet for packet in container.demux(stream) if packet.size]
        except Exception as exc:  # FFmpeg errors while demuxing: a corrupt or truncated file
            raise MediaError(f"the video does not demux: {type(exc).__name__}: {_reason(exc)}") from exc
        if not packets:
            raise MediaError("the video stream holds no frames")
        rate = stream.average_rate or stream.guessed_rate or _FALLBACK_RATE
        start, duration = clip_span(_packet_times(stream, packets, rate))
        width, height = stream.codec_context.width, stream.codec_context.height
    times = sample_times(
        start,
        duration,
        fps=config.video_fps,
        max_frames=config.video_max_frames,
        temporal_patch_size=config.temporal_patch_size,
    )
    height, width = smart_resize(
        height, width, factor=config.factor, min_pixels=config.video_min_pixels, max_pixels=config.video_max_pixels
    )
    frames = padded_count(len(times), config.temporal_patch_size)
    return frames // config.temporal_patch_size, height // config.patch_size, width // config.patch_size


def _reason(exc: Exception) -> str:
    """FFmpeg's words for an error, without PyAV's errno and file name (``'<none>'`` for bytes)."""
    return getattr(exc, "strerror", None) or str(exc)


def _video_stream(container: av.container.InputContainer, config: VisionConfig) -> av.video.stream.VideoStream:
    format_name = container.format.name
    if format_name == "image2" or format_name.endswith("_pipe"):
        raise MediaError(f"a still image ({format_name}), not a video")
    if not container.streams.video:
        kinds = sorted({stream.type for stream in container.streams}) or ["nothing"]
        raise MediaError(f"no video stream in the {format_name} file (it holds {', '.join(kinds)})")
    stream = container.streams.video[0]
    if stream.codec_context is None:
        raise MediaError(f"the video codec of the {format_name} file has no decoder in this FFmpeg build")
    width, height = stream.codec_context.width, stream.codec_context.height
    if width * height > config.max_decoded_pixels:
        pixels = f"{width}x{height} = {width * height} pixels"
        raise MediaError(f"video frames of {pixels}, more than max_decoded_pixels {config.max_decoded_pixels}")
    return stream


def _sampled_frames(
    stream: av.video.stream.VideoStream, packets: list[av.Packet], config: VisionConfig
) -> list[np.ndarray]:
    """The sampled frames, resized, as uint8 ``[height, width, 3]`` arrays (a frame taken twice: one array)."""
    if not packets:
        raise MediaError("the video stream holds no frames")
    rate = stream.average_rate or stream.guessed_rate or _FALLBACK_RATE
    times = _packet_times(stream, packets, rate)
    start, duration = clip_span(times)
    picker = FramePicker(
        sample_times(
            start,
            duration,
            fps=config.video_fps,
            max_frames=config.video_max_frames,
            temporal_patch_size=config.temporal_patch_size,
        )
    )
    resize = _FrameResizer(config)
    picked: list[np.ndarray] = []
    previous = None
    for index, frame in enumerate(_decoded(stream, packets)):
        time = frame.time if frame.time is not None else start + float(index / rate)
        if taken := picker.before(time):
            picked += [resize(previous if previous is not None else frame)] * taken
        previous = frame
        if picker.done:
            break
    if previous is None:
        raise MediaError(f"the video stream's {len(packets)} packets decode to no frames")
    if picker.remaining:
        picked += [resize(previous)] * picker.remaining
    return picked


def _packet_times(stream: av.video.stream.VideoStream, packets: list[av.Packet], rate: Fraction) -> np.ndarray:
    """Presentation times in seconds; by count and rate when a packet has no timestamp."""
    if stream.time_base is None or any(packet.pts is None for packet in packets):
        return np.arange(len(packets), dtype=np.float64) / float(rate)
    return np.array([float(packet.pts * stream.time_base) for packet in packets], dtype=np.float64)


def _decoded(stream: av.video.stream.VideoStream, packets: list[av.Packet]) -> Iterator[av.VideoFrame]:
    decoder = stream.codec_context
    for packet in packets:
        yield from decoder.decode(packet)
    yield from decoder.decode(None)  # the frames the decoder still holds


class _FrameResizer:
    """Frames to RGB at the smart size of the first frame it sees (FFmpeg's scaler, bicubic)."""

    def __init__(self, config: VisionConfig) -> None:
        self.config = config
        self.size: tuple[int, int] | None = None

    def __call__(self, frame: av.VideoFrame) -> np.ndarray:
        if self.size is None:
            config = self.config
            if frame.width * frame.height > config.max_decoded_pixels:
                pixels = f"{frame.width}x{frame.height} = {frame.width * frame.height} pixels"
                raise MediaError(f"video frames of {pixels}, more than max_decoded_pixels {config.max_decoded_pixels}")
            self.size = smart_resize(
                frame.height,
                frame.width,
                factor=config.factor,
                min_pixels=config.video_min_pixels,
                max_pixels=config.video_max_pixels,
            )
        height, width = self.size
        return frame.reformat(width=width, height=height, format="rgb24", interpolation="BICUBIC").to_ndarray()
