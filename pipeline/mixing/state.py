"""The mixer's state between steps: a few floats per source, stored in the constructor's state record."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from topics.errors import DecodeError

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
        """Compact JSON; floats round-trip exactly. About 20 bytes plus 25 per source."""
        body = {"v": STATE_VERSION, "step": self.step, "credit": self.credit, "long": self.long_credit}
        return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> MixerState:
        """The state ``to_bytes`` wrote; ``DecodeError`` if ``data`` is not one."""
        try:
            body = json.loads(data)
            if not isinstance(body, dict) or body.get("v") != STATE_VERSION:
                version = body.get("v") if isinstance(body, dict) else None
                msg = f"mixer state version {version!r}, expected {STATE_VERSION}"
                raise DecodeError(msg)
            step, credit, long_credit = body["step"], body["credit"], body["long"]
            if (
                not isinstance(step, int) or step < 0
                or not isinstance(credit, dict)
                or not all(isinstance(v, int | float) and math.isfinite(v) for v in [*credit.values(), long_credit])
            ):
                msg = f"mixer state has fields of the wrong type or range: {body!r:.200}"
                raise DecodeError(msg)
        except (ValueError, KeyError, TypeError) as exc:
            msg = f"not a mixer state record: {exc}"
            raise DecodeError(msg) from exc
        return cls(step=step, credit={str(k): float(v) for k, v in credit.items()}, long_credit=float(long_credit))
