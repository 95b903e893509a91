"""A context-parallel batch as it travels (version 3): the slices' tokens and what their labels need, no more.

A ``CPBatch`` holds, per slice token, its label and its position; both follow from the slice itself. Positions
are the zigzag rule's (``cp_slices.zigzag_positions``) of the row's length, ``cp_size`` and ``cp_rank``. A
slice is one chunk (``cp_size`` 1, the whole sample) or two; within a chunk, a token's label is the next slice
token or ``-100``, and at a chunk's last token it is the sample's token after the chunk (on another rank) or
``-100``. So a row travels with its tokens, the runs of slice tokens whose label is not ``-100``
(``label_runs``: ``[start, stop)`` bounds in slice order) and, per chunk, the token that follows it where its last
token's label is one (``chunk_next``; ``0`` where not): about 4 bytes a token, where tokens, labels and
positions took 12. ``to_wire`` refuses a batch whose labels are not its next tokens; ``from_wire`` rebuilds
the batch's records exactly.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from topics.formats.cp_batch import CP_BATCH_SCHEMA, CPBatch
from topics.formats.cp_slices import IGNORE_INDEX, zigzag_positions
from topics.formats.loss_spans import target_mask

CP_WIRE_SCHEMA = pa.schema(
    [
        *(CP_BATCH_SCHEMA.field(name) for name in ("sample_id", "source", "micro_batch", "tokens")),
        *(CP_BATCH_SCHEMA.field(name) for name in ("length", "cp_size", "cp_rank")),
        pa.field("label_runs", pa.list_(pa.int32()), nullable=False),
        pa.field("chunk_next", pa.list_(pa.int32()), nullable=False),
    ]
)
"""The columns of a context-parallel batch on the wire, in this order (FORMAT.md, version 3)."""


class _Chunks:
    """Where each slice token lies: its row, its index in the row's slice, its chunk (``row_chunk``: numbered
    over the batch) and whether it ends its chunk."""

    def __init__(self, offsets: np.ndarray, cp_size: np.ndarray) -> None:
        counts = np.diff(offsets)
        self.per_row = np.where(cp_size > 1, 2, 1)
        size = counts // self.per_row
        self.row = np.repeat(np.arange(counts.size), counts)
        self.within = np.arange(int(offsets[-1]), dtype=np.int64) - offsets[:-1][self.row]
        self.first_chunk = np.cumsum(self.per_row) - self.per_row
        chunk_size = np.maximum(size[self.row], 1)
        self.row_chunk = self.first_chunk[self.row] + self.within // chunk_size
        self.ends = self.within % chunk_size == chunk_size - 1


def to_wire(batch: CPBatch) -> pa.RecordBatch:
    """``batch``'s records as they travel (``CP_WIRE_SCHEMA``). ValueError where a label is neither ``-100`` nor
    the sample's next token as far as the slice shows it."""
    offsets, tokens, labels = batch.offsets, batch.tokens, batch.labels
    chunks = _Chunks(offsets, batch.cp_size)
    target = labels != IGNORE_INDEX
    following = np.empty_like(tokens)
    following[:-1] = tokens[1:]
    inner = target & ~chunks.ends
    if (labels[inner] != following[inner]).any():
        at = int(np.flatnonzero(inner & (labels != following))[0])
        msg = f"row {int(chunks.row[at])}: the label of slice token {int(chunks.within[at])} is not its next token"
        raise ValueError(msg)
    chunk_next = np.zeros(int(chunks.per_row.sum()), np.int32)
    ends = target & chunks.ends
    chunk_next[chunks.row_chunk[ends]] = labels[ends]
    starts = target & ((chunks.within == 0) | ~np.concatenate([[False], target[:-1]]))
    stops = target & (_row_ends(offsets, target.size) | ~_next(target))
    run_rows = chunks.row[starts]
    bounds = np.empty(2 * run_rows.size, np.int32)
    bounds[0::2] = chunks.within[starts]
    bounds[1::2] = chunks.within[stops] + 1
    run_offsets = np.searchsorted(run_rows, np.arange(batch.num_samples + 1)) * 2
    records = batch.records
    columns = [records.column(name) for name in ("sample_id", "source", "micro_batch", "tokens")]
    columns += [records.column(name) for name in ("length", "cp_size", "cp_rank")]
    columns += [
        pa.ListArray.from_arrays(pa.array(run_offsets.astype(np.int32)), pa.array(bounds, pa.int32())),
        pa.ListArray.from_arrays(
            pa.array((np.concatenate([[0], np.cumsum(chunks.per_row)])).astype(np.int32)), pa.array(chunk_next)
        ),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=CP_WIRE_SCHEMA)


def from_wire(records: pa.RecordBatch) -> pa.RecordBatch:
    """The records of the ``CPBatch`` that ``to_wire`` wrote (``CP_BATCH_SCHEMA``): positions and labels rebuilt.
    ValueError where the runs or the chunks' tokens do not fit the slices."""
    if [(f.name, f.type) for f in records.schema] != [(f.name, f.type) for f in CP_WIRE_SCHEMA]:
        msg = f"the columns are {records.schema.names}, not those of a version-3 batch: {CP_WIRE_SCHEMA.names}"
        raise ValueError(msg)
    if any(records.column(name).null_count for name in CP_WIRE_SCHEMA.names):
        raise ValueError("a column of a version-3 batch holds nulls")
    ints = {name: records.column(name).to_numpy(zero_copy_only=False) for name in ("length", "cp_size", "cp_rank")}
    token_lists = records.column("tokens")
    offsets = token_lists.offsets.to_numpy().astype(np.int64)
    offsets -= offsets[0]
    tokens = token_lists.flatten().to_numpy(zero_copy_only=False)
    positions, counts = zigzag_positions(ints["length"], ints["cp_size"], ints["cp_rank"])
    if counts.shape != np.diff(offsets).shape or (counts != np.diff(offsets)).any():
        raise ValueError("a row's tokens are not its slice's (padded length / cp_size)")
    chunks = _Chunks(offsets, ints["cp_size"])
    runs, chunk_next = records.column("label_runs"), records.column("chunk_next")
    if (chunk_next.value_lengths().to_numpy(zero_copy_only=False) != chunks.per_row).any():
        raise ValueError("a row's chunk_next does not hold one token per chunk of its slice")
    run_bounds = runs.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    run_offsets = runs.offsets.to_numpy().astype(np.int64) - runs.offsets.to_numpy()[0]
    _check_runs(run_bounds, run_offsets, np.diff(offsets))
    target = target_mask(offsets, run_offsets, run_bounds)
    labels = np.full(tokens.size, IGNORE_INDEX, np.int32)
    inner = target & ~chunks.ends
    labels[inner] = tokens[np.flatnonzero(inner) + 1]
    ends = target & chunks.ends
    labels[ends] = chunk_next.flatten().to_numpy(zero_copy_only=False)[chunks.row_chunk[ends]]
    list_offsets = pa.array(offsets.astype(np.int32))
    columns = [records.column(name) for name in ("sample_id", "source", "micro_batch", "tokens")]
    columns += [pa.ListArray.from_arrays(list_offsets, pa.array(v.astype(np.int32))) for v in (labels, positions)]
    columns += [records.column(name) for name in ("length", "cp_size", "cp_rank")]
    return pa.RecordBatch.from_arrays(columns, schema=CP_BATCH_SCHEMA)


def _next(target: np.ndarray) -> np.ndarray:
    following = np.zeros_like(target)
    following[:-1] = target[1:]
    return following


def _row_ends(offsets: np.ndarray, size: int) -> np.ndarray:
    ends = np.zeros(size, bool)
    ends[offsets[1:][offsets[1:] > offsets[:-1]] - 1] = True
    return ends


def _check_runs(bounds: np.ndarray, run_offsets: np.ndarray, slice_lengths: np.ndarray) -> None:
    if run_offsets.size != slice_lengths.size + 1 or (np.diff(run_offsets) % 2).any():
        raise ValueError("label_runs must hold [start, stop) pairs, one list per row")
    row = np.repeat(np.arange(slice_lengths.size), np.diff(run_offsets) // 2)
    starts, stops = bounds[0::2], bounds[1::2]
    if ((starts < 0) | (stops <= starts) | (stops > slice_lengths[row])).any():
        raise ValueError("a label run lies outside its slice or is empty")
    same_row = row[1:] == row[:-1]
    if (same_row & (starts[1:] <= stops[:-1])).any():
        raise ValueError("label runs out of order, overlapping or touching")
