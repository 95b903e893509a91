"""What a rank's reader hands to the trainer: each due micro-batch of a batch as tensors (``Delivery``),
and at the job's end ``EndOfData``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from topics.errors import DecodeError, MixflowError
from topics.formats.batch import Batch
from topics.formats.cp_batch import CPBatch
from trainer_sink.cp_tensors import cp_micro_batch_tensors, delivered_micro_batches
from trainer_sink.position import SinkPosition
from trainer_sink.read_options import ReadOptions
from trainer_sink.tensors import MicroBatch, micro_batch_tensors, nbytes


@dataclass(frozen=True)
class Delivery:
    """One micro-batch and where it came from."""

    tensors: MicroBatch
    offset: int | None  # None on a topic of several lanes: a position there is found again by step
    step: int
    micro_batch: int
    micro_batches: int
    ranks: int


@dataclass(frozen=True)
class EndOfData:
    steps: int


def due_deliveries(
    batch: Batch | CPBatch, offset: int | None, position: SinkPosition, options: ReadOptions
) -> Iterator[tuple[Delivery, int]]:
    """The micro-batches of ``batch`` (read at ``offset``) that are due after ``position``, as tensors laid
    out by ``options`` (pinned with ``pin_memory``), each with its size in bytes. A context-parallel batch's are
    this rank's slices (``trainer_sink.cp_tensors``), packed."""
    if isinstance(batch, CPBatch):
        yield from _due(cp_micro_batch_tensors(_packed_only(batch, options)), batch, offset, position, options)
        return
    try:
        micro_batches = micro_batch_tensors(
            batch,
            options.tensor_layout,
            pad_token_id=options.pad_token_id,
            attention_mask=options.attention_mask,
            pad_to_multiple_of=options.pad_to_multiple_of,
            pixels=options.pixels,
        )
    except DecodeError as exc:  # a JPEG or PNG frame that does not decode to its item's size
        raise DecodeError(f"step {batch.step}: {exc.reason}", topic=position.topic, offset=offset) from exc
    yield from _due(micro_batches, batch, offset, position, options)


def _due(
    micro_batches: list[MicroBatch],
    batch: Batch | CPBatch,
    offset: int | None,
    position: SinkPosition,
    options: ReadOptions,
) -> Iterator[tuple[Delivery, int]]:
    count = delivered_micro_batches(batch) if isinstance(batch, CPBatch) else batch.micro_batches
    for m, tensors in enumerate(micro_batches):
        if not position.is_due(batch.step, m):
            continue
        if options.pin_memory:
            tensors = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in tensors.items()}
        yield Delivery(tensors, offset, batch.step, m, count, batch.ranks), nbytes(tensors)


def _packed_only(batch: CPBatch, options: ReadOptions) -> CPBatch:
    if options.tensor_layout != "packed":
        msg = (
            f"step {batch.step}: a context-parallel job's batches hold each rank's slices in the packed layout "
            f"(cu_seqlens_padded); tensor_layout={options.tensor_layout!s} cannot hold them"
        )
        raise MixflowError(msg)
    return batch
