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
from topics.kafka.rank_principals import TRAINER, placeholder_problems
from topics.kafka.settings import resolve_role_settings, setting_problems
from trainer_sink.vlm.qwen2_vl import PixelOptions

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
DEFAULT_BOOTSTRAP_SERVERS = "localhost:9092"
# A vision section's patch sizes when it does not give them (pipeline/spec/vision.py, Qwen2-VL's).
VISION_PATCH_DEFAULTS = {"patch_size": 14, "temporal_patch_size": 2}


@dataclass(frozen=True)
class SinkSource:
    """A job's rank topics and how to reach them. ``ranks`` is ``None`` when not known (no spec);
    ``patch_sizes`` the ``(patch_size, temporal_patch_size)`` of each of the spec's multimodal sources."""

    job: str
    kafka_config: Mapping[str, Any] = field(default_factory=dict)
    ranks: int | None = None
    patch_sizes: tuple[tuple[int, int], ...] = ()
    context_parallel: bool = False  # the spec's step plans blocks of ranks: a topic per data x context rank

    @classmethod
    def from_spec(
        cls,
        path: str | os.PathLike[str],
        bootstrap_servers: str | None = None,
        environ: Mapping[str, str] | None = None,
        rank: int | None = None,
    ) -> SinkSource:
        """From a job spec file. Bootstrap servers: ``bootstrap_servers`` if given, else
        ``$KAFKA_BOOTSTRAP_SERVERS``, else the spec's ``kafka.bootstrap_servers`` (as every role does).
        Settings: ``kafka.config`` with the ``trainer`` principal over it, ``{rank}`` in it replaced by ``rank``
        (a principal per rank: ``topics.kafka.rank_principals``), secrets' references resolved from
        ``environ`` (default ``os.environ``) or their files (``topics.kafka.settings``)."""
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
        settings = _trainer_settings(path, kafka, environ, rank)
        step = body.get("step") or {}
        ranks = step.get("ranks") if isinstance(step, dict) else None
        if ranks is not None and (isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1):
            msg = f"job spec {path}: field 'step.ranks' must be a positive int, not {ranks!r}"
            raise MixflowError(msg)
        env = os.environ if environ is None else environ
        servers = bootstrap_servers or env.get(BOOTSTRAP_ENV) or kafka.get("bootstrap_servers")
        config = {**settings, "bootstrap.servers": servers or DEFAULT_BOOTSTRAP_SERVERS}
        cp = isinstance(step, dict) and step.get("context_parallel") is not None
        return cls(job, config, ranks, _patch_sizes(body.get("sources")), cp)

    def pixel_options(self, pixels: PixelOptions | None) -> PixelOptions | None:
        """``pixels`` checked against the job's patch sizes, or, left out, the job's patch sizes with the default
        normalization; ``MixflowError`` when they differ (the first batch with media would be refused)."""
        sizes = sorted(set(self.patch_sizes))
        if not sizes:
            return pixels
        if len(sizes) > 1:
            listed = ", ".join(f"patch_size {p} and temporal_patch_size {t}" for p, t in sizes)
            msg = f"job {self.job}: its multimodal sources cut media into patches of several sizes ({listed})"
            raise MixflowError(msg)
        patch, temporal = sizes[0]
        if pixels is None:
            return PixelOptions(patch_size=patch, temporal_patch_size=temporal)
        if (pixels.patch_size, pixels.temporal_patch_size) != (patch, temporal):
            msg = (
                f"pixels: PixelOptions(patch_size={pixels.patch_size}, temporal_patch_size="
                f"{pixels.temporal_patch_size}) differ from the job {self.job}'s vision sections (patch_size {patch}, "
                f"temporal_patch_size {temporal}): give those, or leave pixels out to take the job's"
            )
            raise MixflowError(msg)
        return pixels


def _patch_sizes(sources: object) -> tuple[tuple[int, int], ...]:
    """The patch sizes of the multimodal sources of a spec's ``sources`` (a source with a ``vision`` section);
    what is not a well-formed source is left to the loaders' spec check."""
    found = []
    for source in sources if isinstance(sources, list) else []:
        vision = source.get("vision") if isinstance(source, dict) else None
        if isinstance(vision, dict):
            sizes = {name: vision.get(name, default) for name, default in VISION_PATCH_DEFAULTS.items()}
            if all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in sizes.values()):
                found.append((sizes["patch_size"], sizes["temporal_patch_size"]))
    return tuple(found)


def _trainer_settings(path: Path, kafka: object, environ: Mapping[str, str] | None, rank: int | None) -> dict[str, Any]:
    """The spec's ``kafka.config`` with the ``trainer`` principal over it, for ``rank``, references resolved."""
    if not isinstance(kafka, dict):
        msg = f"job spec {path}: field 'kafka' must be a mapping"
        raise MixflowError(msg)
    config = kafka.get("config") or {}
    principals = kafka.get("principals") or {}
    if not isinstance(config, dict) or not isinstance(principals, dict):
        msg = f"job spec {path}: fields 'kafka.config' and 'kafka.principals' must be mappings"
        raise MixflowError(msg)
    trainer = principals.get("trainer") or {}
    if not isinstance(trainer, dict):
        msg = f"job spec {path}: field 'kafka.principals.trainer' must be a mapping"
        raise MixflowError(msg)
    for where, settings, role in (("kafka.config", config, None), ("kafka.principals.trainer", trainer, TRAINER)):
        for key, problem in [*setting_problems(settings), *placeholder_problems(settings, role)]:
            msg = f"job spec {path}: {where} {key}: {problem}"
            raise MixflowError(msg)
    return resolve_role_settings(config, {TRAINER: trainer}, TRAINER, environ=environ, rank=rank)
