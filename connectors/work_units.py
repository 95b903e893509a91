"""Work units: the pieces a source is split into, each read and published as one Kafka transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from topics.formats.json_record import decode, encode, json_field, json_record

UnitKind = Literal["file", "row_group", "rows"]
UNIT_KINDS: tuple[str, ...] = get_args(UnitKind)


@json_record("work unit", strict=True, extra="forbid")
@dataclass(frozen=True, slots=True)
class WorkUnit:
    """Rows ``[start, stop)`` of one file of a source, for one epoch.

    ``kind`` says how the reader addresses them: ``file`` (the whole file), ``row_group`` (Parquet row
    group ``row_group``, whose rows are ``[start, stop)`` of the file) or ``rows`` (a row range of a
    file that can be split anywhere, or only where its planned layout allows). ``byte_offset`` is where row
    ``start`` begins in the file, for readers that can seek to it; in a compressed file, where the gzip member or
    zstd frame holding row ``start`` begins, with ``skip_bytes`` of its decompressed bytes before that row (the
    end of a row begun in the frame before). ``estimated_bytes`` is the content size the planner costed the unit
    at: decompressed bytes, for a compressed file whose lines were counted.
    ``etag`` and ``object_size``, set for a file in an object store, pin the version planned: reading
    another version (or none) is refused. They and ``skip_bytes`` are left out of the JSON while empty, so a local
    source's units carry neither, and no uncompressed file's unit carries ``skip_bytes``.

    The JSON form (:meth:`to_json`, ``topics.formats.json_record``) is an object of exactly these fields, keys
    sorted. :meth:`from_json` validates it with a pydantic model made from them at the first decode (planning
    and reading units need no pydantic): strict types (an int is not a bool or a float), no unknown
    fields, then the checks below.
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
    etag: str = json_field(omit_default=True, default="")
    object_size: int = json_field(omit_default=True, default=0)
    skip_bytes: int = json_field(omit_default=True, default=0)

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
        if min(self.epoch, self.estimated_bytes, self.byte_offset, self.object_size, self.skip_bytes) < 0:
            msg = (
                f"work unit of {self.path}: epoch, estimated_bytes, byte_offset, object_size and skip_bytes "
                "must be >= 0"
            )
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
        return encode(self, sort_keys=True)

    @classmethod
    def from_json(cls, data: bytes) -> WorkUnit:
        """Decode :meth:`to_json` output; ``DecodeError`` naming each wrong field otherwise."""
        return decode(cls, data)
