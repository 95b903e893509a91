"""The mixer's state between steps: a few floats per source, stored in the constructor's state record."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, FiniteFloat, NonNegativeInt

from topics.validation import decode_versioned_json

STATE_VERSION = 1


@dataclass(frozen=True)
class MixerState:
    """``step`` is the next step to draw. ``credit[s]`` is the tokens source ``s`` is owed (positive)
    or has had in advance (negative) against its share of what was delivered so far; the credits sum
    to about 0. ``long_credit`` is the same for long-context tokens. Missing sources have credit 0."""

    step: int = 0
    credit: dict[str, float] = field(default_factory=dict)
    long_credit: float = 0.0

    @classmethod
    def initial(cls, sources: Iterable[str], step: int = 0) -> MixerState:
        return cls(step=step, credit=dict.fromkeys(sources, 0.0))

    def to_bytes(self) -> bytes:
        """Compact JSON (a :class:`MixerStateDocument`); floats round-trip exactly. About 20 bytes plus 25
        per source."""
        body = {"v": STATE_VERSION, "step": self.step, "credit": self.credit, "long": self.long_credit}
        return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> MixerState:
        """The state ``to_bytes`` wrote; ``DecodeError`` naming what is wrong otherwise."""
        return decode_versioned_json(
            data, what="mixer state", version=STATE_VERSION, document=MixerStateDocument
        ).state()


class MixerStateDocument(BaseModel):
    """The JSON form of a :class:`MixerState`: ``{"v":1,"step":12,"credit":{"a":0.5},"long":-3.0}``.

    Strict: ``step`` is a non-negative int, the credits and ``long`` finite numbers (ints are taken as
    floats; bools are refused). Unknown fields are ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    v: Literal[1]
    step: NonNegativeInt
    credit: dict[str, FiniteFloat]
    long: FiniteFloat

    def state(self) -> MixerState:
        return MixerState(step=self.step, credit=dict(self.credit), long_credit=self.long)
