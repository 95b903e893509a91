"""Where a compressed file's frames begin, and so where its work units may: planning's view of gzip members and
zstd frames."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class FrameIndex:
    """The frames of a compressed file, in order: frame ``k`` begins at compressed byte ``offsets[k]``, and its
    decompressed bytes at ``starts[k]`` of the file's decompressed bytes (both int64, non-decreasing). Lines run
    across frames as they like: a unit starts at the first line that begins in a frame, decoding from that
    frame's first byte and passing over the end of a line that began in the frame before."""

    offsets: np.ndarray
    starts: np.ndarray

    def __post_init__(self) -> None:
        if len(self.offsets) != len(self.starts) or not len(self.offsets) or self.offsets[0] != 0:
            msg = f"a frame index needs as many offsets as starts, the first at 0 (got {self.offsets}, {self.starts})"
            raise ValueError(msg)

    @property
    def count(self) -> int:
        return len(self.offsets)

    def cut_rows(self, row_bounds: np.ndarray) -> np.ndarray:
        """The rows a unit may start at, ascending: 0, the first row that begins in or after each later frame, and
        the row count. ``row_bounds``: where each row starts in the decompressed bytes, then where the last ends."""
        num_rows = len(row_bounds) - 1
        firsts = np.searchsorted(row_bounds[:-1], self.starts[1:], side="left")  # num_rows past the last row start
        return np.unique(np.concatenate([[0], firsts, [num_rows]])).astype(np.int64)

    def entry(self, position: int) -> tuple[int, int]:
        """Where to decode from to reach decompressed byte ``position``: the compressed offset of the frame that
        holds it, and how many of that frame's decompressed bytes come before it."""
        frame = int(np.searchsorted(self.starts, position, side="right")) - 1
        return int(self.offsets[frame]), position - int(self.starts[frame])
