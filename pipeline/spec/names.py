"""Job and source names as pydantic types, checked by the same rules as the topic names they become."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from topics.errors import InvalidNameError
from topics.formats.names import MAX_JOB_LENGTH, MAX_SOURCE_LENGTH, validate_job_name, validate_source_name

NAME_PATTERN = r"^[a-zA-Z0-9_-]+$"


def _job_name(value: str) -> str:
    try:
        return validate_job_name(value)
    except InvalidNameError as exc:
        raise ValueError(str(exc)) from exc


def _source_name(value: str) -> str:
    try:
        return validate_source_name(value)
    except InvalidNameError as exc:
        raise ValueError(str(exc)) from exc


JobName = Annotated[
    str,
    AfterValidator(_job_name),
    Field(
        description="Job name: the prefix of every topic of the job; [a-zA-Z0-9_-] only ('.' separates "
        "topic name parts).",
        json_schema_extra={"pattern": NAME_PATTERN, "maxLength": MAX_JOB_LENGTH},
    ),
]
SourceName = Annotated[
    str,
    AfterValidator(_source_name),
    Field(
        description="Source name: part of the source's topic names and of its sample ids; [a-zA-Z0-9_-].",
        json_schema_extra={"pattern": NAME_PATTERN, "maxLength": MAX_SOURCE_LENGTH},
    ),
]
