"""Splitting a source into work units of similar expected cost, in a seeded order per epoch."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from functools import partial

import numpy as np

from connectors.readers.base import FileLayout, Reader
from connectors.seeding import stable_rng
from connectors.work_units import WorkUnit


def unit_bytes(cost_per_byte: float, target_unit_cost: float) -> int:
    """The content bytes one unit should hold so that reading and tokenizing it costs ``target_unit_cost``."""
    if not (cost_per_byte > 0 and math.isfinite(cost_per_byte)):
        msg = f"cost_per_byte must be a positive number of seconds, got {cost_per_byte}"
        raise ValueError(msg)
    if not (target_unit_cost > 0 and math.isfinite(target_unit_cost)):
        msg = f"target_unit_cost must be a positive number of seconds, got {target_unit_cost}"
        raise ValueError(msg)
    return max(1, int(target_unit_cost / cost_per_byte))


def cut_rows(bounds: np.ndarray, cuts: np.ndarray, max_bytes: int) -> np.ndarray:
    """Rows at which to split, picked from the allowed ``cuts`` (row numbers, first 0, last the row count).

    ``bounds[r]`` is where row ``r`` starts, in bytes. The file is split into ``ceil(bytes / max_bytes)``
    pieces of about equal bytes, each cut moved to the nearest allowed row, so a piece exceeds
    ``max_bytes`` by at most the largest gap between allowed cuts (one row, or one row group)."""
    total = int(bounds[cuts[-1]] - bounds[cuts[0]])
    pieces = max(1, -(-total // max_bytes))
    ideal = bounds[cuts[0]] + total * np.arange(1, pieces) / pieces
    cut_bytes = bounds[cuts]
    right = np.clip(np.searchsorted(cut_bytes, ideal), 1, len(cuts) - 1)
    nearer_left = (ideal - cut_bytes[right - 1]) < (cut_bytes[right] - ideal)
    chosen = cuts[right - nearer_left]
    return np.unique(np.concatenate([cuts[:1], chosen, cuts[-1:]]))


def split_file(source: str, layout: FileLayout, max_bytes: int, epoch: int = 0) -> list[WorkUnit]:
    """The units of one file, in row order, covering each of its rows exactly once; an object's units carry
    its ETag and size (``pinned``)."""
    return pinned(_split_file(source, layout, max_bytes, epoch), layout.etag, layout.size_bytes)


def pinned(units: list[WorkUnit], etag: str, object_size: int) -> list[WorkUnit]:
    """``units`` with the ETag and size of the object they read, when it has an ETag."""
    if not etag:
        return units
    return [dataclasses.replace(unit, etag=etag, object_size=object_size) for unit in units]


def _split_file(source: str, layout: FileLayout, max_bytes: int, epoch: int) -> list[WorkUnit]:
    bounds = layout.row_bounds
    whole = WorkUnit(source, layout.path, "file", 0, layout.num_rows, epoch, layout.content_bytes)
    if layout.problem is not None:
        return [WorkUnit(source, layout.path, "file", 0, 0, epoch, layout.size_bytes)]
    if layout.num_rows == 0:
        return []
    rows = cut_rows(bounds, _allowed_cuts(layout), max_bytes)
    if len(rows) == 2:
        return [whole]
    return [
        _piece(source, layout, start, stop, epoch)
        for start, stop in zip(rows[:-1].tolist(), rows[1:].tolist(), strict=True)
    ]


def _allowed_cuts(layout: FileLayout) -> np.ndarray:
    """The rows a unit of ``layout`` may start at (with 0 and the row count): a row group's first row, the first
    row begun in a frame of a compressed file, or any row."""
    if layout.row_groups is not None:
        return layout.row_groups
    if layout.frames is not None:
        return layout.frames.cut_rows(layout.row_bounds)
    return np.arange(layout.num_rows + 1)


def _piece(source: str, layout: FileLayout, start: int, stop: int, epoch: int) -> WorkUnit:
    """Rows ``[start, stop)`` of ``layout`` as a unit: its one row group, or a row range from where row ``start``
    begins (in a compressed file: the frame holding it, and its bytes before it)."""
    bounds = layout.row_bounds
    size = int(bounds[stop] - bounds[start])
    group = _single_group(layout.row_groups, start, stop)
    if group is not None and layout.group_offsets is None:
        return WorkUnit(source, layout.path, "row_group", start, stop, epoch, size, row_group=group)
    offset, skip = (int(bounds[start]), 0) if layout.frames is None else layout.frames.entry(int(bounds[start]))
    if layout.group_offsets is not None and layout.row_groups is not None:
        # A unit starting at a group reads from it; one a loader's split starts inside a group, from the file's start.
        group_at = int(np.searchsorted(layout.row_groups, start))
        begins_group = group_at < len(layout.group_offsets) and layout.row_groups[group_at] == start
        offset = int(layout.group_offsets[group_at]) if begins_group else 0
    return WorkUnit(source, layout.path, "rows", start, stop, epoch, size, byte_offset=offset, skip_bytes=skip)


def _single_group(row_groups: np.ndarray | None, start: int, stop: int) -> int | None:
    """The index of the row group that is exactly rows ``[start, stop)``, if there is one."""
    if row_groups is None:
        return None
    index = int(np.searchsorted(row_groups, start))
    if index + 1 < len(row_groups) and row_groups[index] == start and row_groups[index + 1] == stop:
        return index
    return None


def shuffle_units(units: Sequence[WorkUnit], seed: int, source: str, epoch: int) -> list[WorkUnit]:
    """``units`` in the order drawn for this job seed, source and epoch."""
    order = stable_rng(seed, source, epoch).permutation(len(units))
    return [units[i] for i in order.tolist()]


def plan_units(
    reader: Reader,
    cost_per_byte: float,
    target_unit_cost: float,
    *,
    epoch: int = 0,
    seed: int = 0,
    layouts: Sequence[FileLayout] | None = None,
) -> list[WorkUnit]:
    """All units of the reader's source for ``epoch``, shuffled with ``seed``.

    ``cost_per_byte`` (seconds, see :func:`connectors.cost.measure_cost_per_byte`) and
    ``target_unit_cost`` (seconds) set the unit size, so a source that is slower per byte gets more,
    smaller units. The plan is a pure function of the files and these arguments: store the measured
    cost with the job so a restarted planner makes the same plan. Pass ``layouts`` to plan several
    epochs from one scan of the files."""
    if epoch < 0:
        msg = f"epoch must be >= 0, got {epoch}"
        raise ValueError(msg)
    max_bytes = unit_bytes(cost_per_byte, target_unit_cost)
    units = [
        unit
        for layout in (reader.layouts() if layouts is None else layouts)
        for unit in split_file(reader.source, layout, max_bytes, epoch)
    ]
    return shuffle_units(units, seed, reader.source, epoch)


def split_unit(unit: WorkUnit, layout: FileLayout, max_bytes: int) -> list[WorkUnit]:
    """``unit`` cut into finer units of at most ``max_bytes`` each, in row order, covering its rows once.

    One level down each time it is too big: a file into runs of whole row groups (where it has them),
    any piece still too big into row ranges (in a compressed file, ranges that start where a unit may: at the
    first row begun in a frame, so a file of one frame is not cut). A single row cannot be cut, so only a piece
    of one row may exceed ``max_bytes``. The unit comes back alone when it cannot be cut, or its rows do not fit
    the file's ``layout`` (the file changed since planning: reading the unit reports that)."""
    if max_bytes < 1:
        msg = f"max_bytes must be >= 1, got {max_bytes}"
        raise ValueError(msg)
    if layout.problem is not None or unit.stop > layout.num_rows or unit.num_rows < 2:
        return [unit]
    start, stop = (0, layout.num_rows) if unit.kind == "file" else (unit.start, unit.stop)
    bounds = layout.row_bounds
    pieces: list[tuple[int, int]] = []
    groups = layout.row_groups
    if unit.kind == "file" and groups is not None:
        runs = cut_rows(bounds, groups, max_bytes)
        coarse = list(itertools.pairwise(runs.tolist()))
    else:
        coarse = [(start, stop)]
    ranges = _row_ranges if layout.frames is None else partial(_frame_ranges, layout.frames.cut_rows(bounds))
    if layout.group_offsets is not None and groups is not None:
        ranges = partial(_frame_ranges, groups)  # a unit reads from where its first group begins
    for lo, hi in coarse:
        pieces += ranges(bounds, lo, hi, max_bytes)
    if len(pieces) < 2:
        return [unit]
    units = [_piece(unit.source, layout, lo, hi, unit.epoch) for lo, hi in pieces]
    return pinned(units, unit.etag, unit.object_size)


def _frame_ranges(
    allowed: np.ndarray, bounds: np.ndarray, start: int, stop: int, max_bytes: int
) -> list[tuple[int, int]]:
    """Rows ``[start, stop)`` of a compressed file as ranges of about equal bytes, cut only at the ``allowed``
    rows (``FrameIndex.cut_rows``, or the row groups of a file read from a group's offset): a range exceeds
    ``max_bytes`` by at most the rows of a frame (a group)."""
    inside = allowed[(allowed > start) & (allowed < stop)]
    cuts = cut_rows(bounds, np.concatenate([[start], inside, [stop]]).astype(np.int64), max_bytes)
    return list(itertools.pairwise(cuts.tolist()))


def _row_ranges(bounds: np.ndarray, start: int, stop: int, max_bytes: int) -> list[tuple[int, int]]:
    """Rows ``[start, stop)`` as ranges of about equal bytes, each at most ``max_bytes`` or one row."""
    if int(bounds[stop] - bounds[start]) <= max_bytes:
        return [(start, stop)]
    cuts = cut_rows(bounds, np.arange(start, stop + 1), max_bytes).tolist()
    ranges: list[tuple[int, int]] = []
    for lo, hi in itertools.pairwise(cuts):
        if hi - lo > 1 and int(bounds[hi] - bounds[lo]) > max_bytes:
            ranges += _greedy_ranges(bounds, lo, hi, max_bytes)  # a cut moved to the nearest row overshot
        else:
            ranges.append((lo, hi))
    return ranges


def _greedy_ranges(bounds: np.ndarray, start: int, stop: int, max_bytes: int) -> list[tuple[int, int]]:
    """Rows ``[start, stop)`` as the fewest ranges of at most ``max_bytes``, taking the most rows each time."""
    ranges = []
    while start < stop:
        end = int(np.searchsorted(bounds, bounds[start] + max_bytes, side="right")) - 1
        end = min(max(end, start + 1), stop)
        ranges.append((start, end))
        start = end
    return ranges
