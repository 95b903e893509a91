"""Writing a job's objects as YAML, one file per object, for ``kubectl apply -f DIR``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml

from pipeline.tools.deploy.manifests import Manifest


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


def write_manifests(objects: Sequence[Manifest], out: Path) -> list[Path]:
    """Write each object to ``out/<kind>-<name>.yaml`` and remove other ``*.yaml`` files a former
    rendering of the job left there; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for obj in objects:
        path = out / file_name(obj)
        path.write_text(dump(obj), encoding="utf-8")
        written.append(path)
    for stale in set(out.glob("*.yaml")) - set(written):
        if (
            yaml.safe_load(stale.read_text(encoding="utf-8"))
            .get("metadata", {})
            .get("labels", {})
            .get("app.kubernetes.io/name")
            == "mixflow"
        ):
            stale.unlink()
    return written
