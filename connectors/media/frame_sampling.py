"""Which frames of a clip are kept: sampling times at a frame rate, and the frame each time shows (pure)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

TIME_TOLERANCE_S = 1e-6
"""Frame times are rationals turned into floats: a frame this close after a sampling time still counts."""


def clip_span(times: np.ndarray) -> tuple[float, float]:
    """``(start, duration)`` of a clip whose frames are presented at ``times`` (seconds, any order, not
    empty): from its first frame to the end of its last, shown for the median interval between frames."""
    ordered = np.sort(np.asarray(times, dtype=np.float64))
    interval = float(np.median(np.diff(ordered))) if len(ordered) > 1 else 0.0
    return float(ordered[0]), float(ordered[-1] - ordered[0]) + interval


def sample_times(start: float, duration: float, *, fps: float, max_frames: int, temporal_patch_size: int) -> np.ndarray:
    """When to take a frame: every ``1 / fps`` seconds from ``start`` while within ``duration`` (at least
    once); when that is more than ``max_frames`` rounded down to a multiple of ``temporal_patch_size``,
    that many times spread evenly over the clip instead."""
    cap = max_frames // temporal_patch_size * temporal_patch_size
    if cap < 1:
        msg = f"max_frames {max_frames} holds no multiple of temporal_patch_size {temporal_patch_size}"
        raise ValueError(msg)
    count = max(1, math.ceil(duration * fps - TIME_TOLERANCE_S))
    step = 1.0 / fps
    if count > cap:
        count, step = cap, duration / cap
    return start + np.arange(count, dtype=np.float64) * step


def padded_count(frames: int, temporal_patch_size: int) -> int:
    """``frames`` rounded up to a multiple of ``temporal_patch_size`` (the last frame repeats to pad)."""
    return -(-frames // temporal_patch_size) * temporal_patch_size


class FramePicker:
    """Which frame each sampling time takes, while frames go by in presentation order: the last frame
    presented at or before the time, or the first frame for a time before every frame.

    Offer each frame's time to :meth:`before`: the times it answers (they fall before that frame) take the
    frame offered previously (the current one when it is the first). What is left when the frames run out
    takes the last frame."""

    def __init__(self, targets: Sequence[float] | np.ndarray) -> None:
        self._targets = np.sort(np.asarray(targets, dtype=np.float64))
        self._next = 0

    def before(self, time: float) -> int:
        """How many sampling times fall before a frame presented at ``time``."""
        stop = int(np.searchsorted(self._targets, time - TIME_TOLERANCE_S, side="left"))
        taken = max(0, stop - self._next)
        self._next += taken
        return taken

    @property
    def remaining(self) -> int:
        return len(self._targets) - self._next

    @property
    def done(self) -> bool:
        return self._next == len(self._targets)


def pick_frames(frame_times: Sequence[float] | np.ndarray, targets: Sequence[float] | np.ndarray) -> list[int]:
    """The index (in ``frame_times``, presentation order) of the frame each sorted target takes."""
    picker = FramePicker(targets)
    picked: list[int] = []
    for index, time in enumerate(frame_times):
        picked += [max(index - 1, 0)] * picker.before(float(time))
    return picked + [len(frame_times) - 1] * picker.remaining
