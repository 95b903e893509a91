"""``ReadOptions``: how a sink reads its rank topic: the layout of the tensors it yields, how far it reads
ahead, and how long it waits for a step."""

from __future__ import annotations

from dataclasses import dataclass

from topics.errors import MixflowError
from trainer_sink.tensors import Layout
from trainer_sink.vlm.qwen2_vl import PixelOptions


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """``layout``: packed (one row, ``cu_seqlens``) or padded rows (``trainer_sink.tensors``), padding with
    ``pad_token_id``; ``attention_mask``: whether a packed micro-batch has a block-causal mask too;
    ``pad_to_multiple_of``: a packed micro-batch is padded with one segment to a multiple of that many
    tokens. ``pixels``: the media normalization and the encoder's patch sizes (``PixelOptions``; left out,
    the job's). ``pin_memory``: pin each micro-batch's memory (None: when CUDA is available).
    ``prefetch_bytes``: how much the reading thread holds decoded ahead of the trainer. ``wait_timeout_s``:
    how long the sink waits for a step before it raises ``SinkTimeoutError``, saying at WARNING every
    ``wait_log_interval_s`` what it waits for."""

    layout: Layout | str = Layout.PACKED
    pad_token_id: int = 0
    attention_mask: bool = True
    pad_to_multiple_of: int = 1
    pixels: PixelOptions | None = None
    pin_memory: bool | None = None
    prefetch_bytes: int = 64 * 1024 * 1024
    wait_timeout_s: float = 600.0
    wait_log_interval_s: float = 30.0

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "layout", Layout(self.layout))
        except ValueError as exc:
            msg = f"layout must be one of {', '.join(m.value for m in Layout)}, not {self.layout!r}"
            raise MixflowError(msg) from exc
        if self.pad_to_multiple_of < 1:
            msg = f"pad_to_multiple_of must be at least 1, got {self.pad_to_multiple_of}"
            raise MixflowError(msg)

    @property
    def tensor_layout(self) -> Layout:
        """``layout`` as the ``Layout`` it was made into."""
        return Layout(self.layout)


READ_OPTION_NAMES = frozenset(ReadOptions.__dataclass_fields__)
"""The names of the options, which ``KafkaBatchDataset`` still takes as keywords of its own (deprecated)."""
