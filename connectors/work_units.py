"""Work units: the pieces a source is split into, each read and published as one Kafka transaction."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Literal, get_args

from topics.errors import DecodeError

UnitKind = Literal["file", "row_group", "rows"]
UNIT_KINDS: tuple[str, ...] = get_args(UnitKind)
_STR_FIELDS = frozenset({"source", "path", "kind"})


@dataclass(frozen=True, slots=True)
class WorkUnit:
    """Rows ``[start, stop)`` of one file of a source, for one epoch.

    ``kind`` says how the reader addresses them: ``file`` (the whole file), ``row_group`` (Parquet row
    group ``row_group``, whose rows are ``[start, stop)`` of the file) or ``rows`` (a row range of a
    file that can be split anywhere). ``byte_offset`` is where row ``start`` begins in the file, for
    readers that can seek to it. ``estimated_bytes`` is the content size the planner costed the unit at.
    """

    source: str
    path: str
    kind: UnitKind
    start: int
    stop: int
    epoch: int = 0
    estimated_bytes: int = 0
    row_group: int | None = None
    byte_offset: int = 0

    def __post_init__(self) -> None:
        if self.kind not in UNIT_KINDS:
            msg = f"work unit kind {self.kind!r} is not one of {', '.join(UNIT_KINDS)}"
            raise ValueError(msg)
        if not 0 <= self.start <= self.stop:
            msg = f"work unit rows [{self.start}, {self.stop}) of {self.path} are not a valid range"
            raise ValueError(msg)
        if (self.kind == "row_group") != (self.row_group is not None):
            msg = f"work unit of {self.path}: row_group is set exactly when kind is 'row_group'"
            raise ValueError(msg)
        if self.epoch < 0 or self.estimated_bytes < 0 or self.byte_offset < 0:
            msg = f"work unit of {self.path}: epoch, estimated_bytes and byte_offset must be >= 0"
            raise ValueError(msg)

    @property
    def num_rows(self) -> int:
        return self.stop - self.start

    @property
    def unit_id(self) -> str:
        """Stable and unique within a job, e.g. ``code/part-00001.parquet:row_group=2:128-192@e0``."""
        where = f"row_group={self.row_group}" if self.row_group is not None else self.kind
        return f"{self.source}/{self.path}:{where}:{self.start}-{self.stop}@e{self.epoch}"

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> WorkUnit:
        """Decode :meth:`to_json` output; ``DecodeError`` saying what is wrong otherwise."""
        try:
            raw = json.loads(data)
        except ValueError as exc:
            msg = f"work unit is not JSON: {exc}"
            raise DecodeError(msg) from exc
        if not isinstance(raw, dict):
            msg = f"work unit must be a JSON object, got {type(raw).__name__}"
            raise DecodeError(msg)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - names)
        if unknown:
            msg = f"work unit has unknown fields {unknown}"
            raise DecodeError(msg)
        for name, value in raw.items():
            expected = str if name in _STR_FIELDS else int
            if name == "row_group" and value is None:
                continue
            if not isinstance(value, expected) or isinstance(value, bool):
                msg = f"work unit field {name!r} must be {expected.__name__}, got {value!r}"
                raise DecodeError(msg)
        try:
            return cls(**raw)
        except (TypeError, ValueError) as exc:
            msg = f"work unit {raw!r} is not valid: {exc}"
            raise DecodeError(msg) from exc
