"""Where a rank's batches are: the few fields of a job spec the trainer side needs.

The trainer side reads the job's YAML spec itself (``job``, ``kafka`` and ``step``) instead of
importing ``pipeline``: it knows the batch format and nothing else, which keeps its memory flat.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from topics.errors import MixflowError

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
DEFAULT_BOOTSTRAP_SERVERS = "localhost:9092"


@dataclass(frozen=True)
class SinkSource:
    """A job's rank topics and how to reach them. ``ranks`` is ``None`` when not known (no spec)."""

    job: str
    kafka_config: Mapping[str, Any] = field(default_factory=dict)
    ranks: int | None = None

    @classmethod
    def from_spec(
        cls,
        path: str | os.PathLike[str],
        bootstrap_servers: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> SinkSource:
        """From a job spec file. Bootstrap servers: ``bootstrap_servers`` if given, else
        ``$KAFKA_BOOTSTRAP_SERVERS``, else the spec's ``kafka.bootstrap_servers`` (as every role does)."""
        path = Path(path)
        try:
            body = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            msg = f"cannot read the job spec {path}: {exc}"
            raise MixflowError(msg) from exc
        if not isinstance(body, dict):
            msg = f"job spec {path}: expected a mapping at the top level"
            raise MixflowError(msg)
        job = body.get("job")
        if not isinstance(job, str) or not job:
            msg = f"job spec {path}: field 'job' must be a non-empty string, not {job!r}"
            raise MixflowError(msg)
        kafka = body.get("kafka") or {}
        extra = kafka.get("config") or {} if isinstance(kafka, dict) else None
        if not isinstance(extra, dict):
            msg = f"job spec {path}: field 'kafka.config' must be a mapping"
            raise MixflowError(msg)
        step = body.get("step") or {}
        ranks = step.get("ranks") if isinstance(step, dict) else None
        if ranks is not None and (isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1):
            msg = f"job spec {path}: field 'step.ranks' must be a positive int, not {ranks!r}"
            raise MixflowError(msg)
        env = os.environ if environ is None else environ
        servers = bootstrap_servers or env.get(BOOTSTRAP_ENV) or kafka.get("bootstrap_servers")
        return cls(job, {**extra, "bootstrap.servers": servers or DEFAULT_BOOTSTRAP_SERVERS}, ranks)
