"""The job spec: one YAML file describes a job (the declarative data plane).

``load_spec(path)`` returns a validated ``JobSpec`` or raises ``SpecError`` listing every problem,
each with its field path (``sources[1].tokenizer``), the value found, the file and the line.
``spec_json_schema()`` is the JSON schema of the same models.
"""

from pipeline.spec.job import JobSpec
from pipeline.spec.load import SpecError, SpecProblem, check_files, load_spec, spec_json_schema
from pipeline.spec.mixture import Interpolation, MixturePoint, MixtureSpec
from pipeline.spec.sections import (
    BOOTSTRAP_ENV,
    CostSpec,
    KafkaSpec,
    LongContextSpec,
    OnExhausted,
    StepSpec,
)
from pipeline.spec.sources import DEFAULT_GLOBS, ReaderKind, SourceSpec

__all__ = [
    "BOOTSTRAP_ENV",
    "DEFAULT_GLOBS",
    "CostSpec",
    "Interpolation",
    "JobSpec",
    "KafkaSpec",
    "LongContextSpec",
    "MixturePoint",
    "MixtureSpec",
    "OnExhausted",
    "ReaderKind",
    "SourceSpec",
    "SpecError",
    "SpecProblem",
    "StepSpec",
    "check_files",
    "load_spec",
    "spec_json_schema",
]
