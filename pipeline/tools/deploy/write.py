"""Writing a job's objects as YAML, one file per object, for ``kubectl apply -f DIR``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.tools.deploy.manifests import INSTANCE_LABEL, NAME_LABEL, Manifest
from topics.errors import RefusedError


class _BlockDumper(yaml.SafeDumper):
    """Writes strings of several lines (the spec in its ConfigMap) as literal blocks, readable as written,
    and repeated dicts (a selector and its pod labels) in full rather than as YAML aliases."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _string)


def file_name(obj: Manifest) -> str:
    return f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


def dump(obj: Manifest) -> str:
    return yaml.dump(obj, Dumper=_BlockDumper, sort_keys=False, allow_unicode=True)


@dataclass(frozen=True)
class WrittenManifests:
    """What ``write_manifests`` did: the files it wrote, and the files of the same job it removed (objects a
    former rendering made that this one no longer has)."""

    written: list[Path]
    removed: list[Path]


def write_manifests(objects: Sequence[Manifest], out: Path) -> WrittenManifests:
    """Write each object to ``out/<kind>-<name>.yaml`` and remove the YAML files a former rendering of the
    same job left there. A file counts as the job's when it holds one object labelled as a mixflow object of
    the same job (``app.kubernetes.io/instance``); any other file is never overwritten (``RefusedError``,
    before anything is written) nor removed."""
    instance = _instance(objects[0])
    files = {out / file_name(obj): dump(obj) for obj in objects}
    for path in files:
        if path.exists() and (owner := _owner(path)) != instance:
            whose = f"an object of job {owner}" if owner else "not a mixflow object of this job"
            msg = f"--out {out}: {path.name} is there and is {whose}; not overwriting it (give another --out)"
            raise RefusedError(msg)
    stale = [path for path in _yaml_files(out) if path not in files and _owner(path) == instance]
    out.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
    for path in stale:
        path.unlink()
    return WrittenManifests(list(files), stale)


def _instance(obj: Manifest) -> str:
    return obj["metadata"]["labels"][INSTANCE_LABEL]


def _yaml_files(out: Path) -> list[Path]:
    if not out.is_dir():
        return []
    return sorted(path for pattern in ("*.yaml", "*.yml") for path in out.glob(pattern) if path.is_file())


def _owner(path: Path) -> str | None:
    """The job instance a manifest file belongs to, or None when it is not exactly one mixflow object (an
    empty, broken or multi-document file, another application's object, a file that cannot be read)."""
    try:
        documents = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if len(documents) != 1 or not isinstance(documents[0], dict):
        return None
    metadata = documents[0].get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    if not isinstance(labels, dict) or labels.get(NAME_LABEL) != "mixflow":
        return None
    instance = labels.get(INSTANCE_LABEL)
    return instance if isinstance(instance, str) else None
