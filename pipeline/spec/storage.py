"""Where an object-store source lives and how to reach it: ``path: s3://bucket/prefix`` and a ``storage``
section (per source, or job-wide for every such source). Secrets are never written in a spec: credentials
are the standard AWS chain, or references to an environment variable or a file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from pipeline.spec._paths import resolve_path
from topics.kafka.settings import resolve_reference

S3_SCHEME = "s3://"
_S3_URI = re.compile(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?")


def check_object_uri(value: object) -> object:
    if isinstance(value, str) and value.startswith(S3_SCHEME):
        if not _S3_URI.fullmatch(value) or ".." in value.split("/")[2]:
            msg = "not an s3://bucket/prefix location (bucket: 3-63 lowercase letters, digits, '.' and '-')"
            raise ValueError(msg)
        return value.rstrip("/")
    raise ValueError("not an s3:// location")


ObjectUri = Annotated[str, BeforeValidator(check_object_uri)]
"""``s3://bucket/prefix``: a source root in an S3-compatible object store."""


class SecretReference(BaseModel):
    """Where a secret is: ``{env: VAR}`` or ``{file: path}`` (relative to the spec's folder), exactly one."""

    model_config = ConfigDict(extra="forbid")

    env: str | None = Field(None, min_length=1, description="An environment variable holding the secret.")
    file: Path | None = Field(None, description="A file holding the secret (one final newline dropped).")

    @model_validator(mode="before")
    @classmethod
    def _not_inline(cls, value: object) -> object:
        if isinstance(value, str):
            raise ValueError("give {env: VARIABLE} or {file: PATH}, never the secret itself")
        return value

    @field_validator("file")
    @classmethod
    def _resolve(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return resolve_path(value, info)

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretReference:
        if (self.env is None) == (self.file is None):
            raise ValueError("name exactly one of env and file")
        return self

    def resolve(self, what: str) -> str:
        """The secret; a ``MixflowError`` naming the variable or file (never the value) when it is missing."""
        reference = {"env": self.env} if self.env is not None else {"file": str(self.file)}
        return resolve_reference(reference, what)


class CredentialsSpec(BaseModel):
    """Static credentials, each a reference."""

    model_config = ConfigDict(extra="forbid")

    access_key_id: SecretReference
    secret_access_key: SecretReference
    session_token: SecretReference | None = None


class StorageSpec(BaseModel):
    """How to reach the object store of ``s3://`` sources."""

    model_config = ConfigDict(extra="forbid")

    endpoint_url: str | None = Field(
        None, pattern=r"^https?://[^\s/]+(/.*)?$", description="An S3-compatible endpoint; default AWS."
    )
    region: str | None = Field(None, min_length=1, description="Default: the AWS chain's (AWS_REGION, profile).")
    addressing_style: Literal["path", "virtual", "auto"] = Field(
        "auto", description="Bucket in the path (most S3-compatible servers) or in the host name (AWS)."
    )
    profile: str | None = Field(None, min_length=1, description="A profile of the shared AWS config files.")
    credentials: CredentialsSpec | None = Field(
        None, description="References to static credentials; default: the standard AWS credential chain."
    )
    retry_deadline_s: float = Field(
        60.0, gt=0, allow_inf_nan=False, description="How long a request may keep failing transiently."
    )
    connect_timeout_s: float = Field(5.0, gt=0, allow_inf_nan=False)
    read_timeout_s: float = Field(30.0, gt=0, allow_inf_nan=False)
    on_changed_object: Literal["dead_letter", "stop"] = Field(
        "dead_letter",
        description="An object changed or vanished since planning: its unit is a dead letter and the job goes on"
        " (dead_letter), or the loader publishes nothing of the unit and exits with code 5 (stop).",
    )
