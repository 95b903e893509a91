"""The constructor's per-step checkpoint: what it needs to continue after a step, in a few hundred bytes.

Per source it holds the low watermark (every offset below it is delivered or dead-lettered) and the
offsets above it that are delivered already (long-context draws can take samples out of order). The
deferred samples are held by reference (source, offset), in their priority order; the mixer's credits
and the step number complete it. Samples themselves are never copied: a restart re-reads each source
from its low watermark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, NonNegativeInt, PlainValidator, StrictBool, TypeAdapter

from pipeline.planning.mixing import MixerState, MixtureChange
from pipeline.planning.mixing.changes import MixtureChangeDocument
from pipeline.planning.mixing.state import MixerStateDocument
from pipeline.planning.step.used_bitmap import encode_used, unpack
from topics.validation import decode_versioned_json

STATE_VERSION = 1
MAX_REFUSED = 16


@dataclass(frozen=True)
class SampleRef:
    source: str
    offset: int


@dataclass(frozen=True)
class SourcePosition:
    """``low``: the first offset not yet delivered. ``used``: delivered offsets above ``low``, sorted."""

    low: int = 0
    used: tuple[int, ...] = ()


@dataclass(frozen=True)
class ConstructorState:
    """The state after step ``step - 1``: the next step to write is ``step`` (``mixer.step``)."""

    mixer: MixerState
    positions: dict[str, SourcePosition] = field(default_factory=dict)
    deferred: tuple[SampleRef, ...] = ()
    exhausted: tuple[str, ...] = ()
    finished: bool = False
    changes: tuple[MixtureChange, ...] = ()
    """Mixture changes accepted so far (some may apply from later steps), in the order accepted."""
    control_offset: int = 0
    """The next offset of ``<job>.control`` to read for mixture changes."""
    refused: tuple[str, ...] = ()
    """Ids of the latest mixture changes refused (at most ``MAX_REFUSED``), for ``set-mixture`` to report."""

    @property
    def step(self) -> int:
        return self.mixer.step

    @classmethod
    def initial(cls, mixer: MixerState) -> ConstructorState:
        return cls(mixer=mixer, positions={s: SourcePosition() for s in mixer.credit})

    def to_bytes(self) -> bytes:
        body: dict[str, object] = {
            "v": STATE_VERSION,
            "mixer": json.loads(self.mixer.to_bytes()),
            "sources": {
                s: [p.low, encode_used(p.low, p.used, encode_offsets(p.used))] for s, p in self.positions.items()
            },
            "deferred": [[r.source, r.offset] for r in self.deferred],
            "exhausted": list(self.exhausted),
            "finished": self.finished,
        }
        if self.control_offset:
            body["control"] = self.control_offset
        if self.changes:
            body["changes"] = [c.to_dict() for c in self.changes]
        if self.refused:
            body["refused"] = list(self.refused)
        return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ConstructorState:
        """The state ``to_bytes`` wrote; ``DecodeError`` naming what is wrong otherwise."""
        return decode_versioned_json(
            data, what="constructor state", version=STATE_VERSION, document=ConstructorStateDocument
        ).state()


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


def _used(value: object) -> tuple[int | tuple[int, int], ...] | str:
    """Used offsets as a list of offsets and runs, or a ``bits:`` bitmap (kept as is: it needs the low
    watermark to be read, ``used_bitmap.unpack``)."""
    if isinstance(value, str):
        unpack(0, value)  # validates it
        return value
    return _USED_LIST.validate_python(value)


_USED_LIST = TypeAdapter(tuple[OffsetItem, ...])
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


class ConstructorStateDocument(BaseModel):
    """The JSON form of a :class:`ConstructorState`, as ``to_bytes`` writes it::

        {"v":1,"mixer":{<MixerStateDocument>},"sources":{"code":[<low>,[<used offset or run>,...]],...},
         "deferred":[["code",<offset>],...],"exhausted":["code",...],"finished":false,"control":<offset>,
         "changes":[{"id":"...","from_step":<step>,"shares":{"code":<share>,...}},...],"refused":["<id>",...]}

    Used offsets are sorted; ``MIN_RUN`` or more consecutive ones are written as a run ``[first, end]``
    (``end`` exclusive), which keeps the record small when composition takes samples out of order. A list
    over ``used_bitmap.BITMAP_ABOVE_BYTES`` is written instead as ``"bits:<base64>"``, a bitmap of the
    offsets from ``low`` on, where that is shorter (at hundreds of ranks and more).
    ``control``, ``changes`` and ``refused`` may be missing (records written before they existed).

    Offsets are validated in pydantic's lax mode, as the ``int()`` this replaces (``"7"`` and ``7.0`` are
    7); ``finished`` must be a JSON boolean and the mixer state is strict. Unknown fields are ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    v: Literal[1]
    mixer: MixerStateDocument
    sources: dict[str, tuple[int, UsedOffsets]]
    deferred: tuple[tuple[str, int], ...]
    exhausted: tuple[str, ...]
    finished: StrictBool
    control: NonNegativeInt = 0
    changes: tuple[MixtureChangeDocument, ...] = ()
    refused: tuple[str, ...] = ()

    def state(self) -> ConstructorState:
        return ConstructorState(
            mixer=self.mixer.state(),
            positions={s: SourcePosition(low, _decode_used(low, used)) for s, (low, used) in self.sources.items()},
            deferred=tuple(SampleRef(s, o) for s, o in self.deferred),
            exhausted=self.exhausted,
            finished=self.finished,
            changes=tuple(c.change() for c in self.changes),
            control_offset=self.control,
            refused=self.refused,
        )
