"""The constructor's per-step checkpoint: what it needs to continue after a step.

Per source it holds the low watermark (every offset below it is delivered or dead-lettered) and the
offsets above it that are delivered already (long-context draws can take samples out of order). The
deferred samples are held by reference (source, offset), in their priority order; the mixer's credits
and the step number complete it. Samples themselves are never copied: a restart re-reads each source
from its low watermark. Its size follows how far out of order samples are taken, never the data: under a
kilobyte or two on the example job, tens of KB where composition leaves thousands of scattered offsets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import GetCoreSchemaHandler, NonNegativeInt, PlainValidator, StrictBool, TypeAdapter
from pydantic_core import CoreSchema

from pipeline.planning.mixing import MixerState, MixtureChange
from pipeline.planning.step.used_bitmap import encode_used, unpack
from topics.formats.json_record import decode, encode, json_field, json_record, shaped_schema

STATE_VERSION = 1
MAX_REFUSED = 16


@dataclass(frozen=True)
class SampleRef:
    """In a state record: ``["code", 17]``."""

    source: str
    offset: int

    def to_json_value(self) -> list[object]:
        return [self.source, self.offset]

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return shaped_schema(handler, tuple[str, int], lambda pair: cls(*pair))


@dataclass(frozen=True)
class SourcePosition:
    """``low``: the first offset not yet delivered. ``used``: delivered offsets above ``low``, sorted.

    In a state record: ``[low, [<used offset or run>, ...]]``, ``MIN_RUN`` or more consecutive used offsets
    as a run ``[first, end]`` (``end`` exclusive), which keeps the record small when composition takes
    samples out of order; a list over ``used_bitmap.BITMAP_ABOVE_BYTES`` is written instead as
    ``"bits:<base64>"``, a bitmap of the offsets from ``low`` on, where that is shorter (at hundreds of
    ranks and more). Offsets are read in pydantic's lax mode, as ``int()`` would take them (``"7"`` and
    ``7.0`` are 7)."""

    low: int = 0
    used: tuple[int, ...] = ()

    def to_json_value(self) -> list[object]:
        return [self.low, encode_used(self.low, self.used, encode_offsets(self.used))]

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return shaped_schema(handler, tuple[int, UsedOffsets], lambda v: cls(v[0], _decode_used(v[0], v[1])))


@json_record(
    "constructor state",
    version=STATE_VERSION,
    order=("mixer", "positions", "deferred", "exhausted", "finished", "control_offset", "changes", "refused"),
)
@dataclass(frozen=True)
class ConstructorState:
    """The state after step ``step - 1``: the next step to write is ``step`` (``mixer.step``).

    Its JSON form (``topics.formats.json_record``)::

        {"v":1,"mixer":{<MixerState>},"sources":{"code":[<low>,[<used offset or run>,...]],...},
         "deferred":[["code",<offset>],...],"exhausted":["code",...],"finished":false,"control":<offset>,
         "changes":[{"id":"...","from_step":<step>,"shares":{"code":<share>,...}},...],"refused":["<id>",...]}

    ``control``, ``changes`` and ``refused`` are left out while empty (so a reader takes a record without
    them). ``finished`` must be a JSON boolean and the mixer state is strict; unknown fields
    are ignored."""

    mixer: MixerState
    positions: dict[str, SourcePosition] = json_field(name="sources", required=True, default_factory=dict)
    deferred: tuple[SampleRef, ...] = json_field(required=True, default=())
    exhausted: tuple[str, ...] = json_field(required=True, default=())
    finished: StrictBool = json_field(required=True, default=False)
    changes: tuple[MixtureChange, ...] = json_field(omit_default=True, default=())
    """Mixture changes accepted so far (some may apply from later steps), in the order accepted."""
    control_offset: NonNegativeInt = json_field(name="control", omit_default=True, default=0)
    """The next offset of ``<job>.control`` to read for mixture changes."""
    refused: tuple[str, ...] = json_field(omit_default=True, default=())
    """Ids of the latest mixture changes refused (at most ``MAX_REFUSED``), for ``set-mixture`` to report."""

    @property
    def step(self) -> int:
        return self.mixer.step

    @classmethod
    def initial(cls, mixer: MixerState) -> ConstructorState:
        return cls(mixer=mixer, positions={s: SourcePosition() for s in mixer.credit})

    def to_bytes(self) -> bytes:
        return encode(self)

    @classmethod
    def from_bytes(cls, data: bytes) -> ConstructorState:
        """The state ``to_bytes`` wrote; ``DecodeError`` naming what is wrong otherwise."""
        return decode(cls, data)


MIN_RUN = 3


def encode_offsets(offsets: tuple[int, ...]) -> list[int | list[int]]:
    """Sorted ``offsets`` as single offsets and ``[first, end]`` runs of ``MIN_RUN`` or more."""
    out: list[int | list[int]] = []
    i = 0
    while i < len(offsets):
        j = i + 1
        while j < len(offsets) and offsets[j] == offsets[j - 1] + 1:
            j += 1
        if j - i >= MIN_RUN:
            out.append([offsets[i], offsets[j - 1] + 1])
        else:
            out.extend(offsets[i:j])
        i = j
    return out


def _offset_item(value: object) -> int | tuple[int, int]:
    """An offset (an int as the lax mode takes one: ``7``, ``"7"``, ``7.0``) or a run ``[first, end]``."""
    if isinstance(value, list | tuple):
        if (
            len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            and 0 <= value[0] < value[1]
        ):
            return int(value[0]), int(value[1])
        msg = f"must be an offset or a run [first, end] of ints with 0 <= first < end, got {value!r}"
        raise ValueError(msg)
    return TypeAdapter(NonNegativeInt).validate_python(value)


OffsetItem = Annotated[int | tuple[int, int], PlainValidator(_offset_item)]
_USED_LIST = TypeAdapter(tuple[OffsetItem, ...])


def _used(value: object) -> tuple[int | tuple[int, int], ...] | str:
    """Used offsets as a list of offsets and runs, or a ``bits:`` bitmap (kept as is: it needs the low
    watermark to be read, ``used_bitmap.unpack``)."""
    if isinstance(value, str):
        unpack(0, value)  # validates it
        return value
    return _USED_LIST.validate_python(value)


UsedOffsets = Annotated[tuple[OffsetItem, ...] | str, PlainValidator(_used)]


def _decode_used(low: int, used: tuple[int | tuple[int, int], ...] | str) -> tuple[int, ...]:
    return unpack(low, used) if isinstance(used, str) else decode_offsets(used)


def decode_offsets(items: tuple[int | tuple[int, int], ...]) -> tuple[int, ...]:
    out: list[int] = []
    for item in items:
        if isinstance(item, tuple):
            out.extend(range(item[0], item[1]))
        else:
            out.append(item)
    return tuple(out)
