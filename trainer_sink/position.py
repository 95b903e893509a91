"""Where a rank's stream of micro-batches stands: the checkpoint of the trainer side."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from topics.errors import MixflowError

STATE_VERSION = 1


@dataclass(frozen=True, slots=True)
class SinkPosition:
    """The next micro-batch to deliver: micro-batch ``micro_batch`` of step ``step``.

    ``offset`` is where reading starts again: the offset of the message that held the last delivered
    micro-batch (its later micro-batches may still be due), or ``None`` before anything was delivered
    (the start of the topic). ``step`` is ``None`` until the first message is seen."""

    topic: str
    partition: int = 0
    offset: int | None = None
    step: int | None = None
    micro_batch: int = 0

    def after(self, offset: int, step: int, micro_batch: int, micro_batches: int) -> SinkPosition:
        """The position once micro-batch ``micro_batch`` of ``step`` (at ``offset``) is delivered."""
        if micro_batch + 1 < micro_batches:
            return SinkPosition(self.topic, self.partition, offset, step, micro_batch + 1)
        return SinkPosition(self.topic, self.partition, offset, step + 1, 0)

    def is_due(self, step: int, micro_batch: int) -> bool:
        """Whether micro-batch ``micro_batch`` of ``step`` is at or after this position."""
        return self.step is None or (step, micro_batch) >= (self.step, self.micro_batch)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "step": self.step,
            "micro_batch": self.micro_batch,
        }

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> SinkPosition:
        """The position ``to_dict`` gave; ``MixflowError`` naming the field otherwise."""
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            version = state.get("version") if isinstance(state, Mapping) else None
            msg = f"not a mixflow sink state of version {STATE_VERSION} (version {version!r})"
            raise MixflowError(msg)
        for name, optional in (("partition", False), ("offset", True), ("step", True), ("micro_batch", False)):
            value = state.get(name)
            if (value is None and optional) or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
                continue
            msg = f"sink state field {name!r} must be a non-negative int{' or None' if optional else ''}, not {value!r}"
            raise MixflowError(msg)
        if not isinstance(state.get("topic"), str):
            msg = f"sink state field 'topic' must be a string, not {state.get('topic')!r}"
            raise MixflowError(msg)
        return cls(state["topic"], state["partition"], state["offset"], state["step"], state["micro_batch"])
