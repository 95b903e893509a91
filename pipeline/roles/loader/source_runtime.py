"""What a source loader needs of the spec for one source: its reader, its sample builder, its plan."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from connectors import FileLayout, Reader, SampleBuilder, TextTokenizer, WorkUnit, make_reader, measure_cost_per_byte
from connectors.media.config import VisionConfig
from connectors.planning import plan_units
from connectors.readers import MediaFields
from connectors.storage import ObjectRefusedError
from pipeline.roles.loader.defaults import TARGET_UNIT_SECONDS
from pipeline.roles.loader.source_storage import source_storage
from pipeline.spec import JobSpec, SourceSpec
from topics.errors import RefusedError

# Content bytes the planner times its tokenizer on.
COST_SAMPLE_BYTES = 1 << 18
# When the job autoscales, the planner times a few KiB once: every source's loaders wait for the plan, and
# an expensive source's full measurement would starve the constructor longer than a rough unit size costs.
QUICK_COST_SAMPLE_BYTES = 1 << 13


@dataclass(frozen=True)
class SourceRuntime:
    spec: SourceSpec
    reader: Reader
    builder: SampleBuilder
    quick_cost: bool = False  # measure the cost on QUICK_COST_SAMPLE_BYTES, once (an autoscaled job)

    @classmethod
    def from_spec(cls, job: JobSpec, source: str) -> SourceRuntime:
        """Build the reader and the sample builder; a missing root or tokenizer is a MixflowError."""
        spec = job.source(source)
        media_fields = None if spec.media_fields is None else MediaFields(**spec.media_fields.given())
        reader = make_reader(
            spec.reader.value,
            spec.name,
            spec.path,
            spec.glob,
            spec.field or "text",
            content="media" if spec.multimodal else "tokens" if spec.pretokenized else "text",
            media_fields=media_fields,
            storage=source_storage(spec, patient=True),
        )
        if reader.storage.remote:
            # One request says what is wrong with the bucket; the planner's listing says what the glob finds.
            reader.storage.probe()
        else:
            reader.files()  # fail at start-up, naming the path, when the root or glob finds nothing
        tokenizer = None if spec.pretokenized else TextTokenizer.from_file(spec.tokenizer)  # type: ignore[arg-type]
        max_length = spec.max_sample_length or job.step.tokens_per_micro_batch
        vision = None if spec.vision is None else VisionConfig(**spec.vision.model_dump())
        builder = SampleBuilder(
            tokenizer,
            max_length=max_length,
            eod_id=spec.eod_token_id,
            vision=vision,
            media_root=reader.storage if reader.storage.remote else spec.path,
            max_patches=job.step.patches_per_micro_batch,
        )
        return cls(spec, reader, builder, quick_cost=job.autoscaling.enabled)

    def measure_cost(self, layouts: list[FileLayout] | None = None) -> float:
        """Seconds per byte to tokenize the source, timed on a sample of its files."""
        # A quarter MiB, timed twice, sizes units well enough; planning is paid once per job.
        if self.quick_cost:
            return measure_cost_per_byte(
                self.reader, self.builder, sample_bytes=QUICK_COST_SAMPLE_BYTES, max_files=2, repeats=1, layouts=layouts
            )
        return measure_cost_per_byte(
            self.reader, self.builder, sample_bytes=COST_SAMPLE_BYTES, repeats=2, layouts=layouts
        )

    def plan(
        self,
        seed: int,
        target_unit_seconds: float = TARGET_UNIT_SECONDS,
        epochs: Iterable[int] | None = None,
        cost_per_byte: float | None = None,
    ) -> list[WorkUnit]:
        """Every unit of ``epochs`` (by default the spec's, ``range(epochs)``), epoch by epoch, each epoch
        in its own order seeded by ``seed`` and the epoch; sized by ``cost_per_byte`` (a recorded cost),
        or else by a measurement. Under ``storage.on_changed_object: stop``, an object that changes while it
        is planned is a ``RefusedError``."""
        try:
            layouts = self.reader.layouts()
            cost = cost_per_byte if cost_per_byte is not None else self.measure_cost(layouts)
        except ObjectRefusedError as exc:
            msg = f"source {self.spec.name}: planning: {exc}; the object changed while it was planned: plan again"
            raise RefusedError(msg) from exc
        units: list[WorkUnit] = []
        for epoch in range(self.spec.epochs) if epochs is None else epochs:
            units += plan_units(self.reader, cost, target_unit_seconds, epoch=epoch, seed=seed, layouts=layouts)
        return units
