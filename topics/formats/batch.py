"""One rank's share of one training step: the packed samples the constructor writes to ``<job>.rank.<r>``.

A ``Batch`` holds an Arrow record batch with one row per sample, ordered by micro-batch, and checks
its invariants when it is made (see ``Batch.__post_init__``). ``topics.formats.batch_codec`` turns it into a
Kafka message and back; FORMAT.md describes the bytes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pyarrow as pa

from topics.formats.loss_spans import (
    LOSS_SPANS_FIELD,
    LOSS_SPANS_KEY,
    format_loss_spans,
    rows_problem,
    sample_bounds,
    target_mask,
)
from topics.formats.media import MediaItem
from topics.formats.media_checks import check_media
from topics.formats.media_column import MEDIA_FIELD, MediaTable, media_column
from topics.formats.sample import Sample

BATCH_SCHEMA = pa.schema(
    [
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("source", pa.dictionary(pa.int32(), pa.string()), nullable=False),
        pa.field("micro_batch", pa.int32(), nullable=False),
        pa.field("tokens", pa.list_(pa.int32()), nullable=False),
    ]
)
"""The columns every batch has, in this order. Readers ignore columns after these."""

MEDIA_BATCH_SCHEMA = BATCH_SCHEMA.append(MEDIA_FIELD)
"""The columns of every batch of a job with media: the four, then ``media`` (``topics.formats.media_column``)."""

OPTIONAL_FIELDS = (MEDIA_FIELD, LOSS_SPANS_FIELD)
"""Columns a batch may have after the four, in this order: ``media`` and ``loss_spans``
(``topics.formats.loss_spans``: each sample's tokens that are targets of the loss; without it, every token)."""

T = TypeVar("T")

CHECK_TRUSTED_ENV = "MIXFLOW_CHECK_TRUSTED_BATCHES"
"""Set to 1 to check batches made with ``trusted=True`` as fully as any other (tests set it)."""


def _non_negative(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        msg = f"{name} must be a non-negative int, not {value!r}"
        raise ValueError(msg)
    return int(value)


@dataclass(frozen=True, slots=True)
class Batch:
    """The samples of data-parallel ``rank`` (of ``ranks``) for training step ``step``.

    ``records`` has the columns of ``BATCH_SCHEMA``: row ``i`` is one sample, in micro-batch
    ``micro_batch[i]`` (``0 <= micro_batch < micro_batches``, non-decreasing down the rows), and no
    micro-batch holds more than ``capacity`` tokens. A batch of a job with media has the ``media`` column
    too (``MEDIA_BATCH_SCHEMA``; ``topics.formats.media_checks`` says what it must satisfy), and with
    ``patches_per_micro_batch`` no micro-batch holds more vision patches. A batch may have ``loss_spans`` last,
    each row's target bounds (``topics.formats.loss_spans``). Making a Batch that breaks these raises
    ``ValueError``.
    """

    step: int
    rank: int
    ranks: int
    micro_batches: int
    capacity: int
    records: pa.RecordBatch
    patches_per_micro_batch: int | None = None

    def __post_init__(self) -> None:
        for name in ("step", "rank", "ranks", "micro_batches", "capacity"):
            _non_negative(name, getattr(self, name))
        if not self.rank < self.ranks:
            msg = f"rank {self.rank} is not below ranks {self.ranks}"
            raise ValueError(msg)
        if self.micro_batches < 1 or self.capacity < 1:
            msg = f"micro_batches and capacity must be at least 1, not {self.micro_batches}, {self.capacity}"
            raise ValueError(msg)
        if not isinstance(self.records, pa.RecordBatch):
            msg = f"records must be a pyarrow.RecordBatch, not {type(self.records).__name__}"
            raise ValueError(msg)
        budget = self.patches_per_micro_batch
        if budget is not None and (_non_negative("patches_per_micro_batch", budget) < 1):
            msg = "patches_per_micro_batch must be at least 1 (None: no budget)"
            raise ValueError(msg)
        self._check_records()
        if self.with_media:
            budget = self.patches_per_micro_batch
            check_media(self.media, self.offsets, self.tokens, self.micro_batch, self.micro_batches, budget)

    def _check_records(self) -> None:
        schema = self.records.schema
        optional = [f for f in OPTIONAL_FIELDS if schema.get_field_index(f.name) >= 0]
        expected_fields = pa.schema([*BATCH_SCHEMA, *optional])
        check_columns(self.records, expected_fields)
        tokens = self.records.column("tokens")
        for name in expected_fields.names:
            if self.records.column(name).null_count:
                msg = f"column {name!r} holds nulls"
                raise ValueError(msg)
        if tokens.flatten().null_count or self.records.column("source").dictionary.null_count:
            msg = "token ids and source names must not be null"
            raise ValueError(msg)
        micro_batch = self.micro_batch
        if micro_batch.size and (micro_batch.min() < 0 or micro_batch.max() >= self.micro_batches):
            msg = f"micro_batch values must lie in [0, {self.micro_batches})"
            raise ValueError(msg)
        if np.any(np.diff(micro_batch) < 0):
            msg = "rows are not ordered by micro_batch"
            raise ValueError(msg)
        per_micro_batch = self.micro_batch_tokens()
        if per_micro_batch.size and per_micro_batch.max() > self.capacity:
            worst = int(per_micro_batch.argmax())
            msg = f"micro-batch {worst} holds {per_micro_batch[worst]} tokens, over capacity {self.capacity}"
            raise ValueError(msg)
        if self.with_loss_spans:
            column = self.records.column(LOSS_SPANS_FIELD.name)
            if column.flatten().null_count:
                raise ValueError("column 'loss_spans' holds null items")
            bound_offsets, bounds = self.loss_bounds()
            problem = rows_problem(bound_offsets, bounds, self.lengths)
            if problem is not None:
                msg = f"row {problem[0]}: loss_spans hold {problem[1]}"
                raise ValueError(msg)

    @classmethod
    def from_arrays(
        cls,
        *,
        step: int,
        rank: int,
        ranks: int,
        micro_batches: int,
        capacity: int,
        sample_ids: Sequence[str] | pa.Array,
        sources: Sequence[str] | pa.DictionaryArray,
        micro_batch: np.ndarray | Sequence[int],
        offsets: np.ndarray | Sequence[int],
        tokens: np.ndarray,
        trusted: bool = False,
        with_media: bool = False,
        media: Sequence[Sequence[MediaItem]] | None = None,
        patches_per_micro_batch: int | None = None,
        loss_spans: Sequence[np.ndarray] | None = None,
    ) -> Batch:
        """Build from flat arrays: sample ``i`` has ids ``tokens[offsets[i]:offsets[i + 1]]``.

        ``offsets`` has one more entry than there are samples, starts at 0 and ends at ``len(tokens)``.
        ``with_media`` adds the ``media`` column (a job with media sets it on every batch, so that all its
        batches have the same columns), ``media[i]`` sample ``i``'s items (``None``: none at all);
        ``patches_per_micro_batch`` is the vision-patch budget of a micro-batch (``None``: none).
        ``loss_spans`` adds the ``loss_spans`` column, ``loss_spans[i]`` sample ``i``'s target bounds
        (``topics.formats.loss_spans``; ``None``: no column, every token a target). ``trusted`` skips
        ``__post_init__``'s checks of the records (about half the time of this call): only for a caller whose
        arrays meet them by construction, as the constructor's ``build_batches`` does from a scheduler plan.
        Batches decoded from Kafka, and all others, are always checked."""
        offsets = np.asarray(offsets, dtype=np.int64)
        tokens = np.asarray(tokens)
        if offsets.ndim != 1 or offsets.size < 1 or offsets[0] != 0 or offsets[-1] != tokens.size:
            msg = f"offsets must run from 0 to len(tokens) = {tokens.size}"
            raise ValueError(msg)
        if tokens.dtype != np.int32 or tokens.size > np.iinfo(np.int32).max:
            msg = f"tokens must be int32 and fewer than 2**31, not {tokens.dtype} x {tokens.size}"
            raise ValueError(msg)
        columns = [
            pa.array(sample_ids, pa.string()),
            source_column(sources),
            pa.array(np.asarray(micro_batch, dtype=np.int32), pa.int32()),
            pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32), pa.int32()), pa.array(tokens)),
        ]
        schema = BATCH_SCHEMA
        if with_media:
            rows = len(columns[0])
            columns.append(media_column(media if media is not None else [()] * rows))
            schema = MEDIA_BATCH_SCHEMA
        elif media is not None and any(media):
            msg = "media given for a batch without the media column (with_media=False)"
            raise ValueError(msg)
        if loss_spans is not None:
            columns.append(_bounds_column(loss_spans))
            schema = schema.append(LOSS_SPANS_FIELD)
        records = pa.RecordBatch.from_arrays(columns, schema=schema)
        fields = (step, rank, ranks, micro_batches, capacity, records, patches_per_micro_batch)
        return made(cls, fields, trusted)

    @classmethod
    def from_samples(
        cls,
        *,
        step: int,
        rank: int,
        ranks: int,
        capacity: int,
        micro_batches: Sequence[Sequence[Sample]],
        with_media: bool = False,
        patches_per_micro_batch: int | None = None,
    ) -> Batch:
        """Build from samples grouped by micro-batch (``micro_batches[m]`` are micro-batch ``m``'s); with
        ``with_media``, with their media (see ``from_arrays``); with the ``loss_spans`` column where a sample
        names its targets (``LOSS_SPANS_KEY`` in its metadata)."""
        samples = [s for group in micro_batches for s in group]
        lengths = np.array([s.length for s in samples], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        arrays = [np.asarray(s.tokens, dtype=np.int32) for s in samples]
        return cls.from_arrays(
            step=step,
            rank=rank,
            ranks=ranks,
            micro_batches=len(micro_batches),
            capacity=capacity,
            sample_ids=[s.sample_id for s in samples],
            sources=[s.source for s in samples],
            micro_batch=np.repeat(np.arange(len(micro_batches)), [len(g) for g in micro_batches]),
            offsets=offsets,
            tokens=np.concatenate(arrays) if arrays else np.zeros(0, np.int32),
            with_media=with_media,
            media=[s.media for s in samples],
            patches_per_micro_batch=patches_per_micro_batch,
            loss_spans=[sample_bounds(s.metadata, s.length) for s in samples] if any_loss_spans(samples) else None,
        )

    @property
    def num_samples(self) -> int:
        return self.records.num_rows

    @property
    def sample_ids(self) -> list[str]:
        return self.records.column("sample_id").to_pylist()

    @property
    def sources(self) -> list[str]:
        """The source of each row, as strings."""
        return self.records.column("source").to_pylist()

    @property
    def micro_batch(self) -> np.ndarray:
        """int32 [samples]: the micro-batch of each row."""
        return self.records.column("micro_batch").to_numpy(zero_copy_only=False)

    @property
    def offsets(self) -> np.ndarray:
        """int64 [samples + 1]: row ``i``'s tokens are ``tokens[offsets[i]:offsets[i + 1]]``."""
        column = self.records.column("tokens")
        offsets = column.offsets.to_numpy().astype(np.int64)
        return offsets - offsets[0]

    @property
    def tokens(self) -> np.ndarray:
        """int32 [total tokens]: every row's token ids, concatenated."""
        return self.records.column("tokens").flatten().to_numpy(zero_copy_only=False)

    @property
    def lengths(self) -> np.ndarray:
        """int64 [samples]: tokens per row."""
        return np.diff(self.offsets)

    def micro_batch_tokens(self) -> np.ndarray:
        """int64 [micro_batches]: tokens per micro-batch."""
        # bincount sums in float64, exact for counts below 2**53.
        sums = np.bincount(self.micro_batch, weights=self.lengths, minlength=self.micro_batches)
        return sums.astype(np.int64)

    @property
    def with_media(self) -> bool:
        """Whether the batch has the ``media`` column (every batch of a job with media has it)."""
        return self.records.schema.get_field_index(MEDIA_FIELD.name) >= 0

    @property
    def media(self) -> MediaTable:
        """The items of the ``media`` column (none in a batch without it)."""
        if not self.with_media:
            return MediaTable.from_column(media_column([()] * self.num_samples))
        return MediaTable.from_column(self.records.column(MEDIA_FIELD.name))

    @property
    def with_loss_spans(self) -> bool:
        """Whether the batch has the ``loss_spans`` column (without it, every token is a target)."""
        return self.records.schema.get_field_index(LOSS_SPANS_FIELD.name) >= 0

    def loss_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """int64 [samples + 1] and int32: row ``i``'s target bounds are ``bounds[offsets[i]:offsets[i + 1]]``
        (``[0, length]`` each without the ``loss_spans`` column)."""
        if not self.with_loss_spans:
            lengths = self.lengths
            bounds = np.stack([np.zeros_like(lengths), lengths], axis=1)[lengths > 0].ravel()
            return np.concatenate([[0], np.cumsum(np.where(lengths > 0, 2, 0))]), bounds.astype(np.int32)
        column = self.records.column(LOSS_SPANS_FIELD.name)
        offsets = column.offsets.to_numpy().astype(np.int64)
        return offsets - offsets[0], column.flatten().to_numpy(zero_copy_only=False)

    def targets(self) -> np.ndarray | None:
        """bool [total tokens]: whether each token is a target of the loss; None without the ``loss_spans``
        column (every token is)."""
        return target_mask(self.offsets, *self.loss_bounds()) if self.with_loss_spans else None

    def samples(self) -> list[Sample]:
        """The rows as ``Sample`` objects (token arrays are views into the batch; media frames are copies; the
        ``loss_spans`` of a batch with them as each sample's ``LOSS_SPANS_KEY``)."""
        tokens, offsets = self.tokens, self.offsets
        media = self.media if self.with_media else None
        spans = self.loss_bounds() if self.with_loss_spans else None
        return [
            Sample(
                sample_id,
                source,
                tokens[offsets[i] : offsets[i + 1]],
                {} if spans is None else {LOSS_SPANS_KEY: format_loss_spans(spans[1][spans[0][i] : spans[0][i + 1]])},
                media=media.row_items(i) if media is not None else (),
            )
            for i, (sample_id, source) in enumerate(zip(self.sample_ids, self.sources, strict=True))
        ]


def check_columns(records: pa.RecordBatch, expected_fields: pa.Schema) -> None:
    """Raise ValueError unless ``records`` has each of ``expected_fields`` with its type, and valid Arrow data."""
    schema = records.schema
    for expected in expected_fields:
        index = schema.get_field_index(expected.name)
        if index < 0:
            msg = f"column {expected.name!r} is missing"
            raise ValueError(msg)
        if schema.field(index).type != expected.type:
            msg = f"column {expected.name!r} has type {schema.field(index).type}, expected {expected.type}"
            raise ValueError(msg)
    try:
        records.validate(full=True)
    except pa.ArrowException as exc:
        msg = f"invalid Arrow data: {exc}"
        raise ValueError(msg) from exc


def any_loss_spans(samples: Sequence[Sample]) -> bool:
    """Whether some of ``samples`` name their targets (their batch then has the ``loss_spans`` column)."""
    return any(LOSS_SPANS_KEY in s.metadata for s in samples)


def _bounds_column(loss_spans: Sequence[np.ndarray]) -> pa.ListArray:
    counts = np.fromiter((np.asarray(b).size for b in loss_spans), np.int64, len(loss_spans))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    flat = np.concatenate([np.zeros(0, np.int32), *loss_spans], dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, pa.int32()))


def source_column(sources: Sequence[str] | pa.DictionaryArray) -> pa.DictionaryArray:
    """The ``source`` column of a batch: the names dictionary-encoded (int32 indices)."""
    if isinstance(sources, pa.DictionaryArray):
        return sources.cast(BATCH_SCHEMA.field("source").type)
    return pa.array(sources, pa.string()).dictionary_encode()


def made(cls: type[T], fields: tuple[object, ...], trusted: bool) -> T:
    """``cls(*fields)``, its checks skipped where ``trusted`` (unless ``CHECK_TRUSTED_ENV`` asks for them)."""
    if not trusted or os.environ.get(CHECK_TRUSTED_ENV) == "1":
        return cls(*fields)
    made_one = object.__new__(cls)
    for name, value in zip(cls.__dataclass_fields__, fields, strict=True):  # type: ignore[attr-defined]
        object.__setattr__(made_one, name, value)
    return made_one
