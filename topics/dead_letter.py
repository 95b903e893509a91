"""A record that could not be turned into samples, with where it came from and why."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """``location`` names the place precisely enough to find it again: a file and row, a row group,
    or a topic, partition and offset. ``payload`` holds the raw bytes when there are any worth keeping."""

    source: str
    location: str
    reason: str
    payload: bytes | None = None
