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

from pydantic import BaseModel, ConfigDict, StrictBool

from pipeline.mixing import MixerState
from pipeline.mixing.state import MixerStateDocument
from topics.validation import decode_versioned_json

STATE_VERSION = 1


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

    @property
    def step(self) -> int:
        return self.mixer.step

    @classmethod
    def initial(cls, mixer: MixerState) -> ConstructorState:
        return cls(mixer=mixer, positions={s: SourcePosition() for s in mixer.credit})

    def to_bytes(self) -> bytes:
        body = {
            "v": STATE_VERSION,
            "mixer": json.loads(self.mixer.to_bytes()),
            "sources": {s: [p.low, list(p.used)] for s, p in self.positions.items()},
            "deferred": [[r.source, r.offset] for r in self.deferred],
            "exhausted": list(self.exhausted),
            "finished": self.finished,
        }
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
         "deferred":[["code",<offset>],...],"exhausted":["code",...],"finished":false}

    Offsets are validated in pydantic's lax mode, as the ``int()`` this replaces (``"7"`` and ``7.0`` are
    7); ``finished`` must be a JSON boolean and the mixer state is strict. Unknown fields are ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    v: Literal[1]
    mixer: MixerStateDocument
    sources: dict[str, tuple[int, tuple[int, ...]]]
    deferred: tuple[tuple[str, int], ...]
    exhausted: tuple[str, ...]
    finished: StrictBool

    def state(self) -> ConstructorState:
        return ConstructorState(
            mixer=self.mixer.state(),
            positions={s: SourcePosition(low, used) for s, (low, used) in self.sources.items()},
            deferred=tuple(SampleRef(s, o) for s, o in self.deferred),
            exhausted=self.exhausted,
            finished=self.finished,
        )
