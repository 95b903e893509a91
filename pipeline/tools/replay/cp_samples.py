"""The whole samples of a context-parallel step, put back together from its slices. Pure: no Kafka.

Each rank's batch of a context-parallel step (format version 3) holds, for every sample whose block covers the
rank, only that rank's slice: its tokens, labels and positions in the sample (``topics.formats.cp_slices``).
Every slice of a sample is in the same step, so the step's batches together hold each of its samples whole:
the tokens go back by the zigzag rule (``cp_slices.reassemble``; a batch's positions are checked against it when
it is decoded), padding dropped. The slices are checked on the way: each sample's block gives exactly one slice
on each of its ranks, they agree on the sample's length, block and source, and every label is the sample's next
token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from topics.errors import MixflowError
from topics.formats.cp_batch import CPBatch
from topics.formats.cp_slices import IGNORE_INDEX, reassemble
from topics.formats.loss_spans import LOSS_SPANS_KEY, bounds_from_labels, format_loss_spans
from topics.formats.sample import Sample


class SlicesError(MixflowError):
    """A step's slices do not make whole samples, each once."""


@dataclass
class _Pieces:
    """What the step holds of one sample so far: its source, length, block (first rank and size), and each
    slice found, by its place in the block (tokens, labels)."""

    source: str
    length: int
    first: int
    size: int
    micro: int = -1  # its micro-batch on the block's first rank
    slices: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class StepSamples:
    """A context-parallel step's samples, whole, and where the step had them: each one's block (its first rank
    and size) and its micro-batch on the block's first rank (int64 arrays, aligned with ``samples``)."""

    samples: list[Sample]
    first: np.ndarray
    size: np.ndarray
    micro: np.ndarray


def whole_samples(batches: Sequence[CPBatch]) -> list[Sample]:
    """The samples of one step's ``batches`` (one per rank, in rank order), each once and whole, in the order
    their blocks' first ranks hold them (rank by rank, row by row). Raises ``SlicesError`` naming the step and
    the sample whose slices are missing, repeated, or disagree."""
    return read_step(batches).samples


def read_step(batches: Sequence[CPBatch]) -> StepSamples:
    """``whole_samples`` of ``batches``, with the blocks and micro-batches they were on."""
    step = batches[0].step if batches else -1
    held: dict[str, _Pieces] = {}
    for batch in batches:
        offsets, tokens, labels = batch.offsets, batch.tokens, batch.labels
        lengths, sizes, places = batch.lengths.tolist(), batch.cp_size.tolist(), batch.cp_rank.tolist()
        micro = batch.micro_batch
        for row, (sample_id, source) in enumerate(zip(batch.sample_ids, batch.sources, strict=True)):
            first = batch.rank - places[row]
            pieces = held.setdefault(sample_id, _Pieces(source, lengths[row], first, sizes[row]))
            if (pieces.source, pieces.length) != (source, lengths[row]):
                msg = (
                    f"step {step}: sample {sample_id}'s slices disagree (one of {source} of {lengths[row]} tokens on "
                    f"rank {batch.rank}, another of {pieces.source} of {pieces.length} tokens)"
                )
                raise SlicesError(msg)
            if (pieces.first, pieces.size) != (first, sizes[row]):
                msg = (
                    f"step {step}: sample {sample_id} is there twice (on the block of {pieces.size} ranks from rank "
                    f"{pieces.first} and on the block of {sizes[row]} ranks from rank {first})"
                )
                raise SlicesError(msg)
            if places[row] in pieces.slices:
                msg = f"step {step}: sample {sample_id} is there twice (rank {batch.rank} holds its slice again)"
                raise SlicesError(msg)
            part = slice(offsets[row], offsets[row + 1])
            pieces.slices[places[row]] = (tokens[part], labels[part])
            if places[row] == 0:
                pieces.micro = int(micro[row])
    samples = [_whole(step, sample_id, pieces) for sample_id, pieces in held.items()]
    where = np.array([(p.first, p.size, p.micro) for p in held.values()], np.int64).reshape(-1, 3)
    return StepSamples(samples, where[:, 0], where[:, 1], where[:, 2])


def _whole(step: int, sample_id: str, pieces: _Pieces) -> Sample:
    """The sample of ``pieces``, checked to be every slice of its block, labelled with its next tokens where
    they are targets (which it names as its ``LOSS_SPANS_KEY`` where not every one is)."""
    if len(pieces.slices) != pieces.size:
        missing = sorted(set(range(pieces.size)) - pieces.slices.keys())
        msg = (
            f"step {step}: sample {sample_id} lacks the slices of rank {pieces.first + missing[0]} (and "
            f"{len(missing) - 1} more) of its block of {pieces.size} ranks from rank {pieces.first}"
        )
        raise SlicesError(msg)
    ordered = [pieces.slices[place] for place in range(pieces.size)]
    whole = reassemble([tokens for tokens, _ in ordered], pieces.length)
    labels = reassemble([labels for _, labels in ordered], pieces.length)
    ignored = labels[:-1] == IGNORE_INDEX
    if ((labels[:-1] != whole[1:]) & ~ignored).any() or labels[-1] != IGNORE_INDEX:
        msg = f"step {step}: sample {sample_id}'s labels are not its next tokens"
        raise SlicesError(msg)
    metadata = {LOSS_SPANS_KEY: format_loss_spans(bounds_from_labels(labels))} if ignored.any() else {}
    return Sample(sample_id, pieces.source, whole, metadata)
