"""One rank's share of a context-parallel step: for every sample placed on the rank, the slice it computes.

Rank ``rank`` of a step of ``ranks`` ranks (every data-parallel x context-parallel rank) holds, for each sample
whose block of ``cp_size`` ranks covers it, slice ``cp_rank`` of that sample (``topics.formats.cp_slices``): the
slice's tokens (padding included), their labels and their positions in the sample, with the sample's length.
Rows are ordered by micro-batch, and the rank's micro-batches are numbered ``0 .. micro_batches - 1``, each one
non-empty and all of one block (its rows share ``cp_size`` and ``cp_rank``), in the order the rank runs them;
ranks of a step may run different numbers of micro-batches (at most ``max_micro_batches``), and the ranks of a
block run its micro-batches in the same order. ``loss_tokens`` is the step's count of tokens that take a loss,
over every rank. FORMAT.md (version 3; ``cp_wire``) describes the bytes; ``topics.formats.batch_codec`` writes
and reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from topics.formats.batch import BATCH_SCHEMA, check_columns, made, source_column
from topics.formats.cp_slices import IGNORE_INDEX, zigzag_positions

CP_MODES = ("static", "aligned", "free")

CP_BATCH_SCHEMA = BATCH_SCHEMA.append(pa.field("labels", pa.list_(pa.int32()), nullable=False))
CP_BATCH_SCHEMA = CP_BATCH_SCHEMA.append(pa.field("positions", pa.list_(pa.int32()), nullable=False))
for _name in ("length", "cp_size", "cp_rank"):
    CP_BATCH_SCHEMA = CP_BATCH_SCHEMA.append(pa.field(_name, pa.int32(), nullable=False))
"""The columns of a context-parallel batch, in this order: the four of every batch (``tokens`` the slice's), then
``labels``, ``positions``, ``length``, ``cp_size`` and ``cp_rank``."""


@dataclass(frozen=True, slots=True)
class CPBatch:
    """The slices of rank ``rank`` (of ``ranks``) in step ``step`` (the module docstring says what they are).
    ``capacity``: the most slice tokens (padding included) a micro-batch holds; ``mode``: the job's
    context-parallel mode. Making one that breaks the layout raises ``ValueError``."""

    step: int
    rank: int
    ranks: int
    micro_batches: int
    max_micro_batches: int
    capacity: int
    mode: str
    loss_tokens: int
    records: pa.RecordBatch

    def __post_init__(self) -> None:
        for name in ("step", "rank", "ranks", "micro_batches", "max_micro_batches", "capacity", "loss_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
                msg = f"{name} must be a non-negative int, not {value!r}"
                raise ValueError(msg)
        if not self.rank < self.ranks or self.capacity < 1 or self.max_micro_batches < 1:
            msg = f"rank {self.rank} of {self.ranks}, capacity {self.capacity}, max {self.max_micro_batches}: invalid"
            raise ValueError(msg)
        if self.micro_batches > self.max_micro_batches:
            msg = f"{self.micro_batches} micro-batches, over the step's most, {self.max_micro_batches}"
            raise ValueError(msg)
        if self.mode not in CP_MODES:
            msg = f"context-parallel mode {self.mode!r} is not one of {', '.join(CP_MODES)}"
            raise ValueError(msg)
        if not isinstance(self.records, pa.RecordBatch):
            msg = f"records must be a pyarrow.RecordBatch, not {type(self.records).__name__}"
            raise ValueError(msg)
        self._check_columns()
        self._check_rows()

    def _check_columns(self) -> None:
        check_columns(self.records, CP_BATCH_SCHEMA)
        for name in CP_BATCH_SCHEMA.names:
            if self.records.column(name).null_count:
                msg = f"column {name!r} holds nulls"
                raise ValueError(msg)
        for name in ("tokens", "labels", "positions"):
            if self.records.column(name).flatten().null_count:
                msg = f"column {name!r} holds null items"
                raise ValueError(msg)
        if self.records.column("source").dictionary.null_count:
            raise ValueError("source names must not be null")

    def _check_rows(self) -> None:
        micro, size, rank_in = self.micro_batch, self.cp_size, self.cp_rank
        if micro.size:
            if np.any(np.diff(micro) < 0):
                raise ValueError("rows are not ordered by micro_batch")
            present = np.unique(micro)
            if present[0] != 0 or present[-1] != self.micro_batches - 1 or present.size != self.micro_batches:
                msg = f"micro_batch values must be every one of 0 .. {self.micro_batches - 1}, got {present.tolist()}"
                raise ValueError(msg)
        elif self.micro_batches:
            msg = f"{self.micro_batches} micro-batches but no rows"
            raise ValueError(msg)
        if (self.lengths < 1).any() or (size < 1).any() or (rank_in < 0).any() or (rank_in >= size).any():
            raise ValueError("every row needs length >= 1, cp_size >= 1 and 0 <= cp_rank < cp_size")
        first = self.rank - rank_in
        if (first < 0).any() or (first + size > self.ranks).any():
            raise ValueError(f"a row's block does not lie within the step's {self.ranks} ranks")
        boundary = np.flatnonzero(np.diff(micro) == 0)
        if (size[boundary] != size[boundary + 1]).any() or (rank_in[boundary] != rank_in[boundary + 1]).any():
            raise ValueError("a micro-batch holds slices of more than one block")
        unit = np.where(size > 1, 2 * size, 1)
        expected = (-(-self.lengths // unit) * unit) // size
        for name in ("tokens", "labels", "positions"):
            got = np.diff(_offsets(self.records.column(name)))
            if got.shape != expected.shape or (got != expected).any():
                row = int(np.flatnonzero(got != expected)[0]) if got.shape == expected.shape else 0
                msg = f"row {row}: {name} holds {got[row]} values, its slice {expected[row]}"
                raise ValueError(msg)
        if (self.positions != zigzag_positions(self.lengths, size, rank_in)[0]).any():
            raise ValueError("a row's positions are not its slice's (zigzag chunks cp_rank and 2*cp_size-1-cp_rank)")
        sums = np.bincount(micro, weights=expected, minlength=self.micro_batches) if micro.size else np.zeros(0)
        if sums.size and sums.max() > self.capacity:
            worst = int(sums.argmax())
            msg = f"micro-batch {worst} holds {int(sums[worst])} slice tokens, over capacity {self.capacity}"
            raise ValueError(msg)

    @classmethod
    def from_arrays(
        cls,
        *,
        step: int,
        rank: int,
        ranks: int,
        max_micro_batches: int,
        capacity: int,
        mode: str,
        loss_tokens: int,
        sample_ids: Sequence[str],
        sources: Sequence[str] | pa.DictionaryArray,
        micro_batch: np.ndarray,
        lengths: np.ndarray,
        cp_size: np.ndarray,
        cp_rank: np.ndarray,
        offsets: np.ndarray,
        tokens: np.ndarray,
        labels: np.ndarray,
        positions: np.ndarray,
        trusted: bool = False,
    ) -> CPBatch:
        """Build from flat arrays: row ``i``'s slice is ``tokens[offsets[i]:offsets[i + 1]]`` (and the same of
        ``labels`` and ``positions``). ``micro_batch`` numbers the rank's micro-batches from 0, in the order it runs
        them. ``trusted`` skips the checks, for a caller whose arrays meet them by construction."""
        offsets = np.asarray(offsets, np.int64)
        if offsets.ndim != 1 or offsets.size < 1 or offsets[0] != 0 or offsets[-1] != np.asarray(tokens).size:
            msg = f"offsets must run from 0 to len(tokens) = {np.asarray(tokens).size}"
            raise ValueError(msg)
        list_offsets = pa.array(offsets.astype(np.int32), pa.int32())
        micro = np.asarray(micro_batch, np.int32)
        columns = [
            pa.array(sample_ids, pa.string()),
            source_column(sources),
            pa.array(micro, pa.int32()),
            *(
                pa.ListArray.from_arrays(list_offsets, pa.array(np.asarray(values, np.int32)))
                for values in (tokens, labels, positions)
            ),
            *(pa.array(np.asarray(values, np.int32), pa.int32()) for values in (lengths, cp_size, cp_rank)),
        ]
        records = pa.RecordBatch.from_arrays(columns, schema=CP_BATCH_SCHEMA)
        micro_batches = int(micro.max()) + 1 if micro.size else 0
        fields = (step, rank, ranks, micro_batches, max_micro_batches, capacity, mode, loss_tokens, records)
        return made(cls, fields, trusted)

    @property
    def num_samples(self) -> int:
        return self.records.num_rows

    @property
    def sample_ids(self) -> list[str]:
        return self.records.column("sample_id").to_pylist()

    @property
    def sources(self) -> list[str]:
        return self.records.column("source").to_pylist()

    def _ints(self, name: str) -> np.ndarray:
        return self.records.column(name).to_numpy(zero_copy_only=False)

    @property
    def micro_batch(self) -> np.ndarray:
        """int32 [rows]: each row's micro-batch on this rank."""
        return self._ints("micro_batch")

    @property
    def lengths(self) -> np.ndarray:
        """int32 [rows]: each row's sample's tokens (unpadded, whole)."""
        return self._ints("length")

    @property
    def cp_size(self) -> np.ndarray:
        """int32 [rows]: the ranks of each row's block."""
        return self._ints("cp_size")

    @property
    def cp_rank(self) -> np.ndarray:
        """int32 [rows]: this rank's place in each row's block (the block starts at ``rank - cp_rank``)."""
        return self._ints("cp_rank")

    @property
    def offsets(self) -> np.ndarray:
        """int64 [rows + 1]: row ``i``'s slice is ``tokens[offsets[i]:offsets[i + 1]]``."""
        return _offsets(self.records.column("tokens"))

    @property
    def tokens(self) -> np.ndarray:
        """int32: every row's slice tokens, concatenated (padding included)."""
        return self.records.column("tokens").flatten().to_numpy(zero_copy_only=False)

    @property
    def labels(self) -> np.ndarray:
        """int32: the label of every slice token (``IGNORE_INDEX`` where none)."""
        return self.records.column("labels").flatten().to_numpy(zero_copy_only=False)

    @property
    def positions(self) -> np.ndarray:
        """int32: every slice token's position in its sample."""
        return self.records.column("positions").flatten().to_numpy(zero_copy_only=False)

    def rank_loss_tokens(self) -> int:
        """The tokens of this rank's slices that take a loss."""
        return int((self.labels != IGNORE_INDEX).sum())


def _offsets(column: pa.Array) -> np.ndarray:
    offsets = column.offsets.to_numpy().astype(np.int64)
    return offsets - offsets[0]
