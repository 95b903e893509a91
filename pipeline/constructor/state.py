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

from pipeline.mixing import MixerState
from topics.errors import DecodeError

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
        try:
            body = json.loads(data)
            if not isinstance(body, dict) or body.get("v") != STATE_VERSION:
                msg = f"constructor state version {body.get('v') if isinstance(body, dict) else None!r}"
                raise DecodeError(msg)
            mixer = MixerState.from_bytes(json.dumps(body["mixer"]).encode())
            positions = {
                str(s): SourcePosition(int(low), tuple(int(o) for o in used))
                for s, (low, used) in body["sources"].items()
            }
            deferred = tuple(SampleRef(str(s), int(o)) for s, o in body["deferred"])
            exhausted = tuple(str(s) for s in body["exhausted"])
            finished = bool(body["finished"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            msg = f"not a constructor state record: {exc}"
            raise DecodeError(msg) from exc
        return cls(mixer, positions, deferred, exhausted, finished)
