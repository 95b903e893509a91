"""One micro-batch as the dict of tensors a training step takes. Pure: no Kafka, no threads.

Packed layout (the default), for varlen attention (``flash_attn_varlen_func``, ``varlen_attn``,
Megatron's packed sequences): the micro-batch's samples concatenated, ``T`` tokens in all.

| key | type | meaning |
|---|---|---|
| ``input_ids`` | int32 [T] | token ids; shares memory with the Kafka message (treat as read-only) |
| ``labels`` | int64 [T] | the next token of the same sample if a target (below); ``-100`` elsewhere, at sample ends |
| ``position_ids`` | int32 [T] | restarting at 0 at every sample |
| ``cu_seqlens`` | int32 [k + 1] | sample ``j`` is ``input_ids[cu_seqlens[j]:cu_seqlens[j + 1]]`` |
| ``max_seqlen`` | int | the longest sample |
| ``step``, ``micro_batch``, ``micro_batches``, ``rank`` | int | where this micro-batch belongs |
| ``sample_ids`` | list[str] | the k sample ids, in order |
| ``padding_tokens`` | int | tokens of the padding segment (0 unless ``pad_to_multiple_of`` asks for one) |

A token is a target of the loss unless its batch's ``loss_spans`` leave it out (a conversation's user turns,
role prefixes and placeholders; every token of a sample that names no spans is one).

With ``pad_to_multiple_of=N`` a non-empty micro-batch gets one padding segment after its last sample, so
that ``T`` is a multiple of N: ``pad_token_id`` tokens, ``labels`` ``-100``, ``position_ids`` from 0, and a
last ``cu_seqlens`` entry (``k + 2`` entries; ``sample_ids`` still names the k samples). Matrix products
over a token count that is a multiple of 8 run faster on tensor cores: on an H200, one transformer block ran
14% slower (median) over other counts, and took 390 ms over 65,533 tokens against 344 ms over the same
tokens padded to 65,536 (benchmarks/README.md); 64 is a good N. ``T`` can exceed the micro-batch capacity
when the capacity is not a multiple of N.

Padded layout, for models without varlen attention: the same tensors padded to the micro-batch
capacity ``C`` (a fixed shape, for CUDA graphs and ``torch.compile``), ``input_ids`` with
``pad_token_id``, ``labels`` with ``-100``, ``position_ids`` with 0, plus ``segment_ids`` int32 [C]
(the sample's index, ``-1`` on padding) and, unless disabled, ``attention_mask`` bool [C, C]: causal
within each sample, nothing across samples or onto padding (``True`` = may attend, as
``scaled_dot_product_attention`` reads it). The mask takes ``C * C`` bytes; build it on the device
from ``segment_ids`` with ``block_causal_mask`` instead where that is too much.

A batch of a job with media (one with the ``media`` column) adds the vision keys of
``trainer_sink.media_tensors`` in both layouts: ``pixel_values``, ``image_grid_thw``, ``mm_token_type_ids``,
``mrope_position_ids`` and the rest; a batch without it has exactly the keys above.
"""

from __future__ import annotations

import warnings
from enum import StrEnum
from typing import Any

import numpy as np
import torch

from topics.formats.batch import Batch
from topics.formats.packing import IGNORE_INDEX, PackedMicroBatch, pack_micro_batches
from trainer_sink.media_tensors import media_tensors
from trainer_sink.vlm.qwen2_vl import PixelOptions, pack_media

MicroBatch = dict[str, Any]


class Layout(StrEnum):
    PACKED = "packed"
    PADDED = "padded"


def _quiet_read_only_warning() -> None:
    """Token ids are a view of the (immutable) message: sharing it is the point, and the sink never writes
    to it. torch warns once per process that such a tensor is not writable; this spends that once here,
    unseen, where no other thread runs (catch_warnings() around each call would not be thread-safe, and
    a filter added to the process's list would be overridden by any filter the trainer adds later)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        read_only = np.frombuffer(bytes(4), dtype=np.int32)
        torch.from_numpy(read_only)


_quiet_read_only_warning()


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``array``'s memory, read-only or not."""
    return torch.from_numpy(array)


def micro_batch_tensors(
    batch: Batch,
    layout: Layout = Layout.PACKED,
    *,
    pad_token_id: int = 0,
    attention_mask: bool = True,
    pad_to_multiple_of: int = 1,
    pixels: PixelOptions | None = None,
) -> list[MicroBatch]:
    """Every micro-batch of ``batch``, in order, empty ones included. ``pad_to_multiple_of`` applies to the
    packed layout (the padded one is always the capacity). A batch with media also gets the vision keys of
    ``trainer_sink.media_tensors``, its frames decoded and normalized by ``pixels``."""
    if pad_to_multiple_of < 1:
        msg = f"pad_to_multiple_of must be at least 1, got {pad_to_multiple_of}"
        raise ValueError(msg)
    media = pack_media(batch, pixels) if batch.with_media else None
    out = []
    for m, packed in enumerate(pack_micro_batches(batch)):
        padding = 0
        if layout is Layout.PACKED:
            padding = -packed.token_ids.size % pad_to_multiple_of  # 0 for an empty micro-batch
            tensors = _packed(packed, padding, pad_token_id)
        else:
            tensors = _padded(packed, batch.capacity, pad_token_id, attention_mask)
        tensors.update(
            max_seqlen=max(packed.max_seqlen, padding),
            padding_tokens=padding,
            step=batch.step,
            micro_batch=m,
            micro_batches=batch.micro_batches,
            rank=batch.rank,
            sample_ids=packed.sample_ids,
        )
        if media is not None:
            padded_to = batch.capacity if layout is Layout.PADDED else None
            tensors.update(media_tensors(media[m], padding, padded_to))
        out.append(tensors)
    return out


def _packed(packed: PackedMicroBatch, padding: int, pad_token_id: int) -> MicroBatch:
    if not padding:
        return {
            "input_ids": _tensor(packed.token_ids),
            "labels": _tensor(packed.labels),
            "position_ids": _tensor(packed.position_ids),
            "cu_seqlens": _tensor(packed.cu_seqlens),
        }
    tokens = packed.token_ids.size
    return {
        "input_ids": torch.from_numpy(np.concatenate([packed.token_ids, np.full(padding, pad_token_id, np.int32)])),
        "labels": torch.from_numpy(np.concatenate([packed.labels, np.full(padding, IGNORE_INDEX, np.int64)])),
        "position_ids": torch.from_numpy(np.concatenate([packed.position_ids, np.arange(padding, dtype=np.int32)])),
        "cu_seqlens": torch.from_numpy(np.append(packed.cu_seqlens, np.int32(tokens + padding))),
    }


def _padded(packed: PackedMicroBatch, capacity: int, pad_token_id: int, with_mask: bool) -> MicroBatch:
    n = packed.token_ids.size
    input_ids = np.full(capacity, pad_token_id, np.int32)
    input_ids[:n] = packed.token_ids
    labels = np.full(capacity, IGNORE_INDEX, np.int64)
    labels[:n] = packed.labels
    position_ids = np.zeros(capacity, np.int32)
    position_ids[:n] = packed.position_ids
    segment_ids = np.full(capacity, -1, np.int32)
    segment_ids[:n] = np.repeat(np.arange(packed.cu_seqlens.size - 1, dtype=np.int32), np.diff(packed.cu_seqlens))
    tensors = {
        "input_ids": torch.from_numpy(input_ids),
        "labels": torch.from_numpy(labels),
        "position_ids": torch.from_numpy(position_ids),
        "cu_seqlens": _tensor(packed.cu_seqlens),
        "segment_ids": torch.from_numpy(segment_ids),
    }
    if with_mask:
        tensors["attention_mask"] = block_causal_mask(tensors["segment_ids"])
    return tensors


def block_causal_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """bool [C, C] from ``segment_ids`` [C]: query ``i`` may attend key ``j`` when both are in the same
    sample and ``j <= i``. A padding query (segment -1) attends only itself, so softmax stays finite."""
    same = segment_ids[:, None] == segment_ids[None, :]
    causal = torch.ones(same.shape, dtype=torch.bool, device=segment_ids.device).tril_()
    mask = same & causal & (segment_ids[None, :] >= 0)
    padding = segment_ids < 0
    mask[padding, padding] = True  # the diagonal of padding rows (a gather of equal index pairs)
    return mask


def nbytes(micro_batch: MicroBatch) -> int:
    """The bytes its tensors hold."""
    return sum(v.numel() * v.element_size() for v in micro_batch.values() if isinstance(v, torch.Tensor))
