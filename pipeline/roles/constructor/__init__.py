"""The data constructor: mixes the source topics by the spec, balances each step with the scheduler and
writes one batch per rank per step in one Kafka transaction with its state record."""

import lazy_loader

from pipeline.planning.step.state import ConstructorState, SampleRef, SourcePosition

# Each name is imported from its module on first use: a process loads only the modules it touches.
__getattr__, _, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "role": ["ConstructorOptions", "DataConstructor"],
        "stats": ["ConstructorStats", "StepRecord"],
    },
)
__all__ += ["ConstructorState", "SampleRef", "SourcePosition"]
