"""The whole job spec, and the checks that need more than one section."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from pipeline.spec._paths import resolve_path
from pipeline.spec._problems import NO_VALUE, Problems
from pipeline.spec.autoscaling import AutoscalingSpec
from pipeline.spec.mixture import MixtureSpec
from pipeline.spec.names import JobName
from pipeline.spec.sections import (
    CompositionSpec,
    ConstructorSpec,
    CostSpec,
    KafkaSpec,
    LongContextSpec,
    OnExhausted,
    StepSpec,
)
from pipeline.spec.sources import SourceSpec
from pipeline.spec.storage import StorageSpec
from topics.kafka.settings import principal_key_problem


class JobSpec(BaseModel):
    """A mixflow job, as one YAML file describes it. Load it with ``load_spec``."""

    model_config = ConfigDict(extra="forbid", title="mixflow job spec")

    job: JobName
    kafka: KafkaSpec = Field(default_factory=KafkaSpec)
    tokenizer: Path | None = Field(None, description="Default tokenizer.json of every source that is not pretokenized.")
    sources: list[SourceSpec] = Field(min_length=1)
    mixture: MixtureSpec
    step: StepSpec
    cost: CostSpec
    composition: CompositionSpec | None = Field(
        default_factory=CompositionSpec,
        description="Choose each step's samples from a look-ahead window so that it can be balanced; "
        "null draws each source's samples in order.",
    )
    long_context: LongContextSpec | None = None
    constructor: ConstructorSpec = Field(
        default_factory=ConstructorSpec, description="Constructor lanes building interleaved steps."
    )
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec, description="Loaders per source that follow demand (off by default)."
    )
    storage: StorageSpec | None = Field(
        None, description="How to reach the object store of every s3:// source without a storage section of its own."
    )
    seed: int = Field(0, ge=0, description="Seed of every random choice of the job.")
    on_exhausted: OnExhausted = Field(
        OnExhausted.STOP,
        description="When a source runs out: " + ", ".join(m.value for m in OnExhausted) + ".",
    )

    @field_validator("tokenizer")
    @classmethod
    def _resolve_tokenizer(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return resolve_path(value, info)

    @model_validator(mode="after")
    def _cross_check(self) -> JobSpec:
        problems = Problems("JobSpec")
        cp = self.step.context_parallel is not None
        if (self.long_context is not None or cp) and "composition" not in self.model_fields_set:
            self.composition = None  # a long-context quota or CP draws in order unless composition is asked for
        if cp and self.composition is not None:
            problems.add(
                ("composition",),
                "packs whole samples into micro-batches; with step.context_parallel steps are drawn in order and "
                "planned per sample (drop composition)",
            )
        self._check_sources(problems)
        for source in self.sources:
            if source.in_object_store and source.storage is None:
                source.storage = self.storage or StorageSpec()
        self._check_mixture(problems)
        self._check_autoscaling(problems)
        names = [s.name for s in self.sources]
        for key in self.kafka.principals:
            if (problem := principal_key_problem(key, names)) is not None:
                problems.add(("kafka", "principals", key), problem, NO_VALUE)
        if self.long_context is not None:
            self._check_long_context(problems, self.long_context)
        problems.raise_if_any()
        return self

    def _check_sources(self, problems: Problems) -> None:
        first: dict[str, int] = {}
        capacity = self.step.longest_sample
        for i, source in enumerate(self.sources):
            if source.name in first:
                problems.add(
                    ("sources", i, "name"), f"duplicate source name (also sources[{first[source.name]}])", source.name
                )
            first.setdefault(source.name, i)
            if source.tokenizer is None and not source.pretokenized:
                if self.tokenizer is None:
                    problems.add(
                        ("sources", i, "tokenizer"),
                        "required unless pretokenized, and there is no job-level tokenizer",
                        NO_VALUE,
                    )
                else:
                    source.tokenizer = self.tokenizer
            if source.max_sample_length is None:
                source.max_sample_length = capacity
            elif source.max_sample_length > capacity:
                problems.add(
                    ("sources", i, "max_sample_length"),
                    f"must be at most step.tokens_per_micro_batch ({capacity})"
                    if self.step.context_parallel is None
                    else f"must be at most the longest sample a block of step.context_parallel.size ranks holds "
                    f"({capacity})",
                    source.max_sample_length,
                )

    def _check_mixture(self, problems: Problems) -> None:
        names = [s.name for s in self.sources]
        weighted: set[str] = set()
        for loc, weights in self.mixture.located_weights():
            for name, share in weights.items():
                if name not in names:
                    problems.add(
                        ("mixture", *loc, name), f"not a source of this job (sources: {', '.join(names)})", name
                    )
                elif share > 0:
                    weighted.add(name)
        for i, name in enumerate(names):
            if name not in weighted:
                problems.add(
                    ("sources", i, "name"),
                    "has no weight above 0 anywhere in mixture, so it would never be read; "
                    "give it a weight or remove it",
                    name,
                )

    def _check_long_context(self, problems: Problems, long: LongContextSpec) -> None:
        if self.composition is not None:
            problems.add(
                ("long_context",),
                "a per-step quota of long samples applies to steps drawn in order, not with composition: drop one "
                "(composition balances long samples and delivers each within its waiting bound)",
            )
            return
        capable = self.long_sources()
        if not capable:
            longest = max(s.max_sample_length or 0 for s in self.sources)
            problems.add(
                ("long_context", "min_length"),
                f"no source can have a sample this long (longest max_sample_length: {longest})",
                long.min_length,
            )
            return
        for (loc, _), (_, shares) in zip(self.mixture.located_weights(), self.mixture.points(), strict=True):
            held = sum(shares.get(name, 0.0) for name in capable)
            if held < long.token_share:
                problems.add(
                    ("mixture", *loc),
                    f"the sources that can have long samples ({', '.join(capable)}) hold {held:.3g} of "
                    f"the tokens here, less than long_context.token_share ({long.token_share})",
                    shares,
                )

    def _check_autoscaling(self, problems: Problems) -> None:
        budget = self.autoscaling.max_total_loaders
        if budget is None:
            return
        fewest = sum(s.loader_bounds()[0] for s in self.sources)
        starting = sum(s.loaders for s in self.sources)
        if budget < max(fewest, starting):
            problems.add(
                ("autoscaling", "max_total_loaders"),
                f"must be at least the sources' loaders to start with ({starting}) and their autoscale.min "
                f"({fewest}) together",
                budget,
            )

    def long_sources(self) -> list[str]:
        """Sources whose samples can reach ``long_context.min_length`` (all of them without it)."""
        min_length = self.long_context.min_length if self.long_context else 0
        return [s.name for s in self.sources if (s.max_sample_length or 0) >= min_length]

    @property
    def source_names(self) -> list[str]:
        return [s.name for s in self.sources]

    def source(self, name: str) -> SourceSpec:
        """The source called ``name``; ``KeyError`` if there is none."""
        for source in self.sources:
            if source.name == name:
                return source
        raise KeyError(name)
