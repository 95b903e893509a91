"""The ``media`` column of a batch: each sample's images and clips (``topics.formats.media.MediaItem``) in Arrow.

``MEDIA_FIELD`` is ``list<struct<kind, grid_t, grid_h, grid_w, merge_size, temporal_patch_size, height, width,
token_offset, encoding, frames: list<binary>>>``, one list per row, nothing nullable (FORMAT.md). ``media_column``
builds it from items; ``MediaTable`` reads it back: integer fields as numpy arrays, and each item's frames as
a view of the Arrow buffer (no copy for raw frames)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from topics.formats.media import CHANNELS, INT_FIELDS, MediaItem

FRAMES_TYPE = pa.list_(pa.field("item", pa.binary(), nullable=False))
MEDIA_ITEM_TYPE = pa.struct(
    [
        pa.field("kind", pa.string(), nullable=False),
        *(pa.field(name, pa.int32(), nullable=False) for name in INT_FIELDS),
        pa.field("encoding", pa.string(), nullable=False),
        pa.field("frames", FRAMES_TYPE, nullable=False),
    ]
)
MEDIA_TYPE = pa.list_(pa.field("item", MEDIA_ITEM_TYPE, nullable=False))
MEDIA_FIELD = pa.field("media", MEDIA_TYPE, nullable=False)
"""The fifth column of a batch of a job with media."""

_INT32_MAX = np.iinfo(np.int32).max


def media_column(media: Sequence[Sequence[MediaItem]]) -> pa.ListArray:
    """The ``media`` column of rows whose items are ``media[i]`` (each in placeholder order)."""
    items = [item for row in media for item in row]
    counts = np.fromiter((len(row) for row in media), np.int64, len(media))
    ints = {name: np.fromiter((getattr(it, name) for it in items), np.int64, len(items)) for name in INT_FIELDS}
    if any(values.size and (values.min() < 0 or values.max() > _INT32_MAX) for values in ints.values()):
        msg = "media fields must lie in [0, 2**31)"
        raise ValueError(msg)
    frame_counts = np.fromiter((len(it.frames) for it in items), np.int64, len(items))
    frames = pa.ListArray.from_arrays(
        pa.array(_offsets(frame_counts), pa.int32()),
        _binary([frame for it in items for frame in it.frames]),
        type=FRAMES_TYPE,
    )
    struct = pa.StructArray.from_arrays(
        [
            pa.array([it.kind for it in items], pa.string()),
            *(pa.array(ints[name].astype(np.int32), pa.int32()) for name in INT_FIELDS),
            pa.array([it.encoding for it in items], pa.string()),
            frames,
        ],
        fields=list(MEDIA_ITEM_TYPE),
    )
    return pa.ListArray.from_arrays(pa.array(_offsets(counts), pa.int32()), struct, type=MEDIA_TYPE)


def _binary(values: Sequence[bytes | memoryview]) -> pa.BinaryArray:
    """``values`` as an Arrow binary array, each copied once into a buffer of their total size from Arrow's
    memory pool (``pa.array`` grows its buffer as it goes, copying what it holds at each growth)."""
    sizes = np.fromiter(map(len, values), np.int64, len(values))
    offsets = _offsets(sizes)
    data = pa.allocate_buffer(int(offsets[-1]))
    into = memoryview(data).cast("B")  # Arrow exports signed bytes ("b"); frames are "B"
    for value, start, end in zip(values, offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
        into[start:end] = value
    return pa.Array.from_buffers(pa.binary(), len(values), [None, pa.py_buffer(offsets), data])


def _offsets(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(counts.size + 1, np.int64)
    np.cumsum(counts, out=out[1:])
    if out[-1] > _INT32_MAX:
        msg = f"{out[-1]} list entries do not fit Arrow's 32-bit offsets"
        raise ValueError(msg)
    return out.astype(np.int32)


@dataclass(frozen=True)
class MediaTable:
    """The items of a batch's ``media`` column, flattened over rows.

    ``row_offsets`` int64 [rows + 1]: row ``i``'s items are ``row_offsets[i]:row_offsets[i + 1]``; ``row`` int64
    [items] the row of each; ``kind`` and ``encoding`` str per item; ``ints`` the int fields (``INT_FIELDS``) as
    int64 [items]; ``frame_offsets`` int64 [items + 1] into the frames, ``frame_bytes`` int64 [frames + 1] byte
    offsets of the frames into ``data`` (uint8, the Arrow buffer of every frame, concatenated); ``nulls`` the
    nulls found anywhere in the items (the type says none; Arrow does not enforce it)."""

    row_offsets: np.ndarray
    row: np.ndarray
    kind: list[str]
    encoding: list[str]
    ints: dict[str, np.ndarray]
    frame_offsets: np.ndarray
    frame_bytes: np.ndarray
    data: np.ndarray
    nulls: int

    @classmethod
    def from_column(cls, column: pa.ListArray) -> MediaTable:
        list_offsets = column.offsets.to_numpy().astype(np.int64)
        lo, hi = int(list_offsets[0]), int(list_offsets[-1])
        struct = column.values.slice(lo, hi - lo)
        children = dict(zip(MEDIA_ITEM_TYPE.names, struct.flatten(), strict=True))
        frames = children["frames"]
        frame_offsets = frames.offsets.to_numpy().astype(np.int64)
        first, last = int(frame_offsets[0]), int(frame_offsets[-1])
        binary = frames.values.slice(first, last - first)
        _, byte_offsets, data = binary.buffers()
        frame_bytes = np.frombuffer(byte_offsets, np.int32, count=len(binary) + 1, offset=binary.offset * 4)
        row_offsets = list_offsets - lo
        return cls(
            row_offsets=row_offsets,
            row=np.repeat(np.arange(len(column), dtype=np.int64), np.diff(row_offsets)),
            kind=children["kind"].to_pylist(),
            encoding=children["encoding"].to_pylist(),
            ints={name: children[name].to_numpy(zero_copy_only=False).astype(np.int64) for name in INT_FIELDS},
            frame_offsets=frame_offsets - first,
            frame_bytes=frame_bytes.astype(np.int64),
            data=np.zeros(0, np.uint8) if data is None else np.frombuffer(data, np.uint8),
            nulls=struct.null_count + sum(child.null_count for child in children.values()) + binary.null_count,
        )

    def __len__(self) -> int:
        return len(self.kind)

    @property
    def patches(self) -> np.ndarray:
        """int64 [items]: ``grid_t * grid_h * grid_w`` (exact for grids below 2**21 a side)."""
        return self.ints["grid_t"] * self.ints["grid_h"] * self.ints["grid_w"]

    @property
    def tokens(self) -> np.ndarray:
        """int64 [items]: placeholder tokens, ``patches // merge_size**2``."""
        return self.patches // (self.ints["merge_size"] * self.ints["merge_size"])

    def frames(self, k: int) -> list[memoryview]:
        """Item ``k``'s frames, each a view of the Arrow buffer."""
        view = self.data.data  # the array's memoryview
        bounds = self.frame_bytes[self.frame_offsets[k] : self.frame_offsets[k + 1] + 1].tolist()
        return [view[a:b] for a, b in itertools.pairwise(bounds)]

    def raw_frames(self, k: int) -> np.ndarray:
        """Item ``k``'s raw frames as uint8 ``[frames, height, width, 3]``, a view of the Arrow buffer."""
        a, b = self.frame_bytes[self.frame_offsets[k]], self.frame_bytes[self.frame_offsets[k + 1]]
        shape = (
            int(self.frame_offsets[k + 1] - self.frame_offsets[k]),
            self.int_at(k, "height"),
            self.int_at(k, "width"),
        )
        return self.data[a:b].reshape(*shape, CHANNELS)

    def int_at(self, k: int, name: str) -> int:
        return int(self.ints[name][k])

    def item(self, k: int, frames: tuple[bytes, ...] | None = None) -> MediaItem:
        """Item ``k`` as a ``MediaItem``; its frames as views of the buffer unless ``frames`` is given."""
        return MediaItem(
            kind=self.kind[k],
            **{name: self.int_at(k, name) for name in INT_FIELDS},
            encoding=self.encoding[k],
            frames=tuple(self.frames(k)) if frames is None else frames,
        )

    def row_items(self, row: int) -> tuple[MediaItem, ...]:
        """Row ``row``'s items with their frames copied out as ``bytes``."""
        lo, hi = int(self.row_offsets[row]), int(self.row_offsets[row + 1])
        return tuple(self.item(k, tuple(bytes(f) for f in self.frames(k))) for k in range(lo, hi))
