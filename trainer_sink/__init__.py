"""mixflow.trainer_sink: the trainer side. One data-parallel rank's batches from its rank topic, as
tensors, with an exact-resume state.

This package imports ``topics`` only: never ``pipeline`` or ``connectors``."""

import lazy_loader

# Each name is imported from its module on first use: a process loads only the modules it touches.
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "dataset": ["KafkaBatchDataset"],
        "parallel": ["ParallelLayout", "rank_from_environment"],
        "position": ["SinkPosition"],
        "read_options": ["ReadOptions"],
        "steps": ["SinkTimeoutError"],
        "tensors": ["Layout", "MicroBatch", "PixelOptions", "block_causal_mask", "micro_batch_tensors"],
    },
)
