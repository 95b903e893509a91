"""mixflow.trainer_sink: the trainer side. One data-parallel rank's batches from its rank topic, as
tensors, with an exact-resume state.

This package imports ``topics`` only: never ``pipeline`` or ``connectors``."""

from trainer_sink.dataset import KafkaBatchDataset
from trainer_sink.parallel import ParallelLayout, rank_from_environment
from trainer_sink.position import SinkPosition
from trainer_sink.reader import SinkTimeoutError
from trainer_sink.tensors import Layout, MicroBatch, block_causal_mask, micro_batch_tensors

__all__ = [
    "KafkaBatchDataset",
    "Layout",
    "MicroBatch",
    "ParallelLayout",
    "SinkPosition",
    "SinkTimeoutError",
    "block_causal_mask",
    "micro_batch_tensors",
    "rank_from_environment",
]
