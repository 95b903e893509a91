"""Measuring what a source costs to tokenize, per byte, so that planning can size its units."""

from __future__ import annotations

import time

import numpy as np

from connectors.planning import pinned
from connectors.readers.base import Document, FileLayout, Reader
from connectors.samples import SampleBuilder
from connectors.work_units import WorkUnit

_FLOOR_SECONDS_PER_BYTE = 1e-12


def sample_units(reader: Reader, layouts: list[FileLayout], sample_bytes: int, max_files: int) -> list[WorkUnit]:
    """The first rows of up to ``max_files`` files spread evenly over the sorted list, about
    ``sample_bytes`` in all: the same every time for the same files."""
    readable = [layout for layout in layouts if layout.problem is None and layout.num_rows]
    if not readable:
        return []
    picks = np.unique(np.linspace(0, len(readable) - 1, min(max_files, len(readable))).round().astype(int))
    per_file = max(1, sample_bytes // len(picks))
    units = []
    for layout in (readable[i] for i in picks.tolist()):
        if not layout.rows_known:  # a small object planned from the listing: read whole
            unit = WorkUnit(reader.source, layout.path, "file", 0, 1, estimated_bytes=layout.size_bytes)
            units += pinned([unit], layout.etag, layout.size_bytes)
            continue
        stop = int(np.searchsorted(layout.row_bounds, layout.row_bounds[0] + per_file, side="left"))
        stop = min(max(stop, 1), layout.num_rows)
        size = int(layout.row_bounds[stop] - layout.row_bounds[0])
        units += pinned(
            [WorkUnit(reader.source, layout.path, "rows", 0, stop, estimated_bytes=size)],
            layout.etag,
            layout.size_bytes,
        )
    return units


def measure_cost_per_byte(
    reader: Reader,
    builder: SampleBuilder,
    *,
    sample_bytes: int = 1 << 20,
    max_files: int = 8,
    repeats: int = 3,
    layouts: list[FileLayout] | None = None,
) -> float:
    """Seconds per (estimated content) byte to turn the source's documents into samples.

    A small deterministic sample (:func:`sample_units`) is read once and built ``repeats`` times; the
    fastest run counts, to keep other work on the machine out of the number. The bytes are the
    layout's estimates, the same ones ``plan_units`` multiplies this cost by."""
    if sample_bytes < 1 or max_files < 1 or repeats < 1:
        msg = f"sample_bytes, max_files and repeats must be >= 1, got {sample_bytes}, {max_files}, {repeats}"
        raise ValueError(msg)
    units = sample_units(reader, reader.layouts() if layouts is None else layouts, sample_bytes, max_files)
    documents = [item for unit in units for item in reader.read(unit) if isinstance(item, Document)]
    total_bytes = sum(unit.estimated_bytes for unit in units)
    if not documents or total_bytes == 0:
        return _FLOOR_SECONDS_PER_BYTE
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        builder.build(documents)
        best = min(best, time.perf_counter() - began)
    return max(best / total_bytes, _FLOOR_SECONDS_PER_BYTE)
