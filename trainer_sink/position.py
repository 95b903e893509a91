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
    micro-batch (its later micro-batches may still be due). ``None`` with ``step`` ``None``: nothing was
    delivered (the start of the topic); ``None`` with a ``step``: the position was carried over from
    another topic (``on_topic``), and reading looks for ``step`` by its number.

    ``ranks`` and ``micro_batches`` are the shape of the step of the last delivered micro-batch (``None``
    before any, or in a state saved before they were recorded): a position in the middle of a step
    carries over to another topic only when that topic's step has the same shape."""

    topic: str
    partition: int = 0
    offset: int | None = None
    step: int | None = None
    micro_batch: int = 0
    ranks: int | None = None
    micro_batches: int | None = None

    def after(
        self, offset: int | None, step: int, micro_batch: int, micro_batches: int, ranks: int | None = None
    ) -> SinkPosition:
        """The position once micro-batch ``micro_batch`` of ``step`` (at ``offset``, a step of ``ranks``
        ranks with ``micro_batches`` micro-batches each) is delivered. ``offset`` is None on a rank topic
        of several constructor lanes: reading there resumes by step number in every partition."""
        shape = {"ranks": ranks, "micro_batches": micro_batches}
        if micro_batch + 1 < micro_batches:
            return SinkPosition(self.topic, self.partition, offset, step, micro_batch + 1, **shape)
        return SinkPosition(self.topic, self.partition, offset, step + 1, 0, **shape)

    @property
    def seeks_step(self) -> bool:
        """Whether reading starts by looking for ``step`` in the topic, not at an offset."""
        return self.offset is None and self.step is not None

    def on_topic(self, topic: str) -> SinkPosition:
        """This position on another rank topic (another rank, or a job replayed under another rank count),
        found there by step: data-parallel ranks train in lockstep, so every rank checkpoints the same step
        and micro-batch. Raises ``MixflowError`` for a position in the middle of a step whose shape is not
        recorded: the micro-batches delivered so far cannot be matched with the other topic's."""
        if topic == self.topic:
            return self
        if self.step is None:
            return SinkPosition(topic)
        if self.micro_batch and self.ranks is None:
            msg = (
                f"the sink state was saved on {self.topic} in the middle of step {self.step} (before micro-batch "
                f"{self.micro_batch}) by a sink that did not record the step's shape, so it cannot resume on "
                f"{topic}: resume there from a checkpoint taken at a step boundary"
            )
            raise MixflowError(msg)
        return SinkPosition(topic, 0, None, self.step, self.micro_batch, self.ranks, self.micro_batches)

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
            "ranks": self.ranks,
            "micro_batches": self.micro_batches,
        }

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> SinkPosition:
        """The position ``to_dict`` gave; ``MixflowError`` naming the field otherwise."""
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            version = state.get("version") if isinstance(state, Mapping) else None
            msg = f"not a mixflow sink state of version {STATE_VERSION} (version {version!r})"
            raise MixflowError(msg)
        fields = (
            ("partition", False, 0),
            ("offset", True, 0),
            ("step", True, 0),
            ("micro_batch", False, 0),
            ("ranks", True, 1),  # absent from states saved before the shape was recorded
            ("micro_batches", True, 1),
        )
        for name, optional, least in fields:
            value = state.get(name)
            if (value is None and optional) or (
                isinstance(value, int) and not isinstance(value, bool) and value >= least
            ):
                continue
            kind = "a non-negative int" if least == 0 else "a positive int"
            msg = f"sink state field {name!r} must be {kind}{' or None' if optional else ''}, not {value!r}"
            raise MixflowError(msg)
        if not isinstance(state.get("topic"), str):
            msg = f"sink state field 'topic' must be a string, not {state.get('topic')!r}"
            raise MixflowError(msg)
        checked: dict[str, Any] = {name: state.get(name) for name, _, _ in fields}
        return cls(state["topic"], **checked)
