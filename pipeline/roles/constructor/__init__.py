"""The data constructor: mixes the source topics by the spec, balances each step with the scheduler and
writes one batch per rank per step in one Kafka transaction with its state record."""

from typing import TYPE_CHECKING

import lazy_loader

from pipeline.planning.step.state import ConstructorState, SampleRef, SourcePosition

if TYPE_CHECKING:  # the lazy names' types, for a type checker
    from pipeline.roles.constructor.role import ConstructorOptions as ConstructorOptions
    from pipeline.roles.constructor.role import DataConstructor as DataConstructor
    from pipeline.roles.constructor.stats import ConstructorStats as ConstructorStats
    from pipeline.roles.constructor.stats import StepRecord as StepRecord

# Each name is imported from its module on first use: a process loads only the modules it touches.
__getattr__, _, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "role": ["ConstructorOptions", "DataConstructor"],
        "stats": ["ConstructorStats", "StepRecord"],
    },
)
__all__ += ["ConstructorState", "SampleRef", "SourcePosition"]
