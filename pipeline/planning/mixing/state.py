"""The mixer's state between steps: a few floats per source, stored in the constructor's state record."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import FiniteFloat, NonNegativeInt

from topics.formats.json_record import decode, encode, json_field, json_record

STATE_VERSION = 1


@json_record("mixer state", version=STATE_VERSION, strict=True)
@dataclass(frozen=True)
class MixerState:
    """``step`` is the next step to draw. ``credit[s]`` is the tokens source ``s`` is owed (positive)
    or has had in advance (negative) against its share of what was delivered so far; the credits sum
    to about 0. ``long_credit`` is the same for long-context tokens. Missing sources have credit 0.

    Its JSON form (``topics.formats.json_record``), about 20 bytes plus 25 per source, floats exact:
    ``{"v":1,"step":12,"credit":{"a":0.5},"long":-3.0}``. Decoding is strict: ``step`` a non-negative int,
    the credits and ``long`` finite numbers (ints are taken as floats; bools are refused); unknown fields
    are ignored."""

    step: NonNegativeInt = json_field(required=True, default=0)
    credit: dict[str, FiniteFloat] = json_field(required=True, default_factory=dict)
    long_credit: FiniteFloat = json_field(name="long", required=True, default=0.0)

    @classmethod
    def initial(cls, sources: Iterable[str], step: int = 0) -> MixerState:
        return cls(step=step, credit=dict.fromkeys(sources, 0.0))

    def to_bytes(self) -> bytes:
        return encode(self)

    @classmethod
    def from_bytes(cls, data: bytes) -> MixerState:
        """The state ``to_bytes`` wrote; ``DecodeError`` naming what is wrong otherwise."""
        return decode(cls, data)
