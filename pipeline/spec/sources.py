"""One data source of a job: where its files are, how to read them, and how to tokenize them."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from pipeline.spec._paths import resolve_path
from pipeline.spec._problems import Problems
from pipeline.spec.autoscaling import SourceAutoscaleSpec
from pipeline.spec.names import SourceName
from pipeline.spec.storage import S3_SCHEME, ObjectUri, StorageSpec, check_object_uri
from pipeline.spec.vision import MediaFieldsSpec, VisionSpec
from topics.formats.file_formats import FILE_FORMATS


def _listed(names: Iterable[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``, in the order of ``FILE_FORMATS``."""
    wanted = set(names)
    ordered = [n for n in FILE_FORMATS if n in wanted]
    return ", ".join(ordered[:-1]) + " and " + ordered[-1] if len(ordered) > 1 else "".join(ordered)


# The file formats of topics.formats.file_formats, as ReaderKind.JSONL == "jsonl", ...
ReaderKind = StrEnum("ReaderKind", [(name.upper(), name) for name in FILE_FORMATS], module=__name__)  # type: ignore[misc]
ReaderKind.__doc__ = "File formats a source loader can read."

DEFAULT_GLOBS: dict[ReaderKind, str] = {ReaderKind(f.name): f.default_glob for f in FILE_FORMATS.values()}
DEFAULT_FIELD = "text"
# Readers of records with named columns or keys; the text reader has none.
COLUMNAR_READERS = frozenset(ReaderKind(f.name) for f in FILE_FORMATS.values() if f.fields)
# Readers of multimodal sources, and those of nothing else.
MEDIA_READERS = frozenset(ReaderKind(f.name) for f in FILE_FORMATS.values() if f.media)
MEDIA_ONLY_READERS = frozenset(ReaderKind(f.name) for f in FILE_FORMATS.values() if f.media and not f.text)


class SourceSpec(BaseModel):
    """A source. After validation ``glob`` and ``field`` hold their defaults, and the job fills in
    ``tokenizer`` (from the job-level one) and ``max_sample_length`` (the step's tokens per
    micro-batch) when they are not given here."""

    model_config = ConfigDict(extra="forbid")

    name: SourceName
    reader: ReaderKind = Field(description="File format: " + ", ".join(r.value for r in ReaderKind))
    path: Path | ObjectUri = Field(
        description="Root folder of the source's files, relative to the spec's folder; or s3://bucket/prefix."
    )
    glob: str | None = Field(
        None,
        min_length=1,
        description="Files under path to read (`**` any folders, `{a,b}` either); default per reader: "
        + ", ".join(f"{r.value} {g}" for r, g in DEFAULT_GLOBS.items()),
    )
    field: str | None = Field(
        None,
        min_length=1,
        description=f"Column or key holding the text (or token ids when pretokenized) for the "
        f"{_listed(r.value for r in COLUMNAR_READERS)} readers; default {DEFAULT_FIELD!r}. Not used by the "
        f"{_listed(r.value for r in ReaderKind if r not in COLUMNAR_READERS)} reader.",
    )
    pretokenized: bool = Field(False, description="The field holds token ids instead of text.")
    tokenizer: Path | None = Field(
        None,
        description="A Hugging Face tokenizer.json, relative to the spec's folder; required unless "
        "pretokenized; defaults to the job-level tokenizer.",
    )
    max_sample_length: Annotated[int, Field(gt=0)] | None = Field(
        None,
        description="Longer documents are split into chunks of at most this many tokens; at most the "
        "step's tokens_per_micro_batch, which is also the default.",
    )
    eod_token_id: Annotated[int, Field(ge=0)] | None = Field(
        None, description="Token appended to the end of each document, if any."
    )
    epochs: int = Field(1, ge=1, description="Passes over the source's files.")
    loaders: int = Field(1, ge=1, description="Source loader processes to start with.")
    unit_target_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        None,
        description="Seconds of loading per work unit: the planner's target (in place of `mixflow load "
        "--unit-seconds`), and the loaders measure the source's cost and split a unit they take that would "
        "run over (file, then row groups, then row ranges); unset: units are sized once, at planning.",
    )
    vision: VisionSpec | None = Field(
        None,
        description="Makes the source multimodal: its documents interleave text with images and clips, "
        "decoded, resized and turned into placeholder tokens as this section says.",
    )
    media_fields: MediaFieldsSpec | None = Field(
        None, description="A multimodal source's keys or columns of text, images, clips and interleaved segments."
    )
    storage: StorageSpec | None = Field(
        None, description="How to reach the object store of an s3:// path; default: the job's storage section."
    )
    autoscale: SourceAutoscaleSpec | None = Field(
        None, description="Bounds of the source's loaders under job-level autoscaling; without it: always `loaders`."
    )

    @field_validator("path", mode="before")
    @classmethod
    def _local_or_object(cls, value: object) -> object:
        """A local path is a ``Path`` before the union sees it, so only ``s3://`` strings are object URIs."""
        if isinstance(value, str) and value.startswith(S3_SCHEME):
            return check_object_uri(value)  # here, or the union would take a bad one as a local Path
        return Path(str(value))

    @field_validator("path", "tokenizer")
    @classmethod
    def _resolve_paths(cls, value: Path | str | None, info: ValidationInfo) -> Path | str | None:
        return resolve_path(value, info) if not isinstance(value, str) else value

    @model_validator(mode="after")
    def _reader_defaults(self) -> SourceSpec:
        problems = Problems("SourceSpec")
        self._check_media(problems)
        if self.vision is not None:
            pass  # _check_media: its text is named in media_fields, and it is never pretokenized
        elif self.reader in COLUMNAR_READERS:
            self.field = self.field or DEFAULT_FIELD
        else:
            if self.field is not None:
                problems.add(("field",), f"the {self.reader.value} reader has no fields; remove it", self.field)
            if self.pretokenized:
                problems.add(("pretokenized",), f"the {self.reader.value} reader reads text, not token ids", True)
        if self.storage is not None and not self.in_object_store:
            problems.add(("storage",), "only a source whose path is s3://bucket/prefix has a storage section")
        if self.autoscale is not None and not self.autoscale.min <= self.loaders <= self.autoscale.max:
            bounds = f"autoscale.min ({self.autoscale.min}) and autoscale.max ({self.autoscale.max})"
            problems.add(("loaders",), f"must be between {bounds}", self.loaders)
        problems.raise_if_any()
        self.glob = self.glob or DEFAULT_GLOBS[self.reader]
        return self

    def _check_media(self, problems: Problems) -> None:
        if self.vision is None:
            if self.reader in MEDIA_ONLY_READERS:
                problems.add(("vision",), f"the {self.reader.value} reader reads media: add a vision section")
            if self.media_fields is not None:
                problems.add(("media_fields",), "only a multimodal source (one with a vision section) has media fields")
            return
        if self.reader not in MEDIA_READERS:
            kinds = _listed(r.value for r in MEDIA_READERS)
            problems.add(("vision",), f"the {self.reader.value} reader reads no media; multimodal readers: {kinds}")
        if self.pretokenized:
            problems.add(("pretokenized",), "a multimodal source tokenizes its text parts", True)
        if self.field is not None:
            problems.add(("field",), "a multimodal source names its text column in media_fields.text", self.field)

    @property
    def in_object_store(self) -> bool:
        return isinstance(self.path, str)

    @property
    def multimodal(self) -> bool:
        return self.vision is not None

    def loader_bounds(self) -> tuple[int, int]:
        """``(fewest, most)`` loaders of the source under autoscaling: ``loaders`` both without ``autoscale``."""
        if self.autoscale is None:
            return self.loaders, self.loaders
        return self.autoscale.min, self.autoscale.max
