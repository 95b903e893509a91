"""Paths in a spec resolve against the folder of the spec file (``context={"base_dir": ...}``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationInfo


def resolve_path(value: Path | None, info: ValidationInfo) -> Path | None:
    """``value`` made absolute against the spec's folder; unchanged when validated without a file."""
    if value is None:
        return None
    value = value.expanduser()
    base = (info.context or {}).get("base_dir")
    if value.is_absolute() or base is None:
        return value
    return (Path(base) / value).resolve()
