"""The data constructor: mixes the source topics by the spec, balances each step with the scheduler and
writes one batch per rank per step in one Kafka transaction with its state record."""

from pipeline.planning.step.state import ConstructorState, SampleRef, SourcePosition
from pipeline.roles.constructor.role import ConstructorOptions, DataConstructor
from pipeline.roles.constructor.stats import ConstructorStats, StepRecord

__all__ = [
    "ConstructorOptions",
    "ConstructorState",
    "ConstructorStats",
    "DataConstructor",
    "SampleRef",
    "SourcePosition",
    "StepRecord",
]
