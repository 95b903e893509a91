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
from typing import Literal

from pydantic import BaseModel, ConfigDict, NonNegativeInt, StrictBool

from pipeline.mixing import MixerState, MixtureChange
from pipeline.mixing.changes import MixtureChangeDocument
from pipeline.mixing.state import MixerStateDocument
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
            "sources": {s: [p.low, list(p.used)] for s, p in self.positions.items()},
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


class ConstructorStateDocument(BaseModel):
    """The JSON form of a :class:`ConstructorState`, as ``to_bytes`` writes it::

        {"v":1,"mixer":{<MixerStateDocument>},"sources":{"code":[<low>,[<used offset>,...]],...},
         "deferred":[["code",<offset>],...],"exhausted":["code",...],"finished":false,"control":<offset>,
         "changes":[{"id":"...","from_step":<step>,"shares":{"code":<share>,...}},...],"refused":["<id>",...]}

    ``control``, ``changes`` and ``refused`` may be missing (records written before they existed).

    Offsets are validated in pydantic's lax mode, as the ``int()`` this replaces (``"7"`` and ``7.0`` are
    7); ``finished`` must be a JSON boolean and the mixer state is strict. Unknown fields are ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    v: Literal[1]
    mixer: MixerStateDocument
    sources: dict[str, tuple[int, tuple[int, ...]]]
    deferred: tuple[tuple[str, int], ...]
    exhausted: tuple[str, ...]
    finished: StrictBool
    control: NonNegativeInt = 0
    changes: tuple[MixtureChangeDocument, ...] = ()
    refused: tuple[str, ...] = ()

    def state(self) -> ConstructorState:
        return ConstructorState(
            mixer=self.mixer.state(),
            positions={s: SourcePosition(low, used) for s, (low, used) in self.sources.items()},
            deferred=tuple(SampleRef(s, o) for s, o in self.deferred),
            exhausted=self.exhausted,
            finished=self.finished,
            changes=tuple(c.change() for c in self.changes),
            control_offset=self.control,
            refused=self.refused,
        )
