"""Mixture changes on a job's control topic (``<job>.control``): publishing one, and the constructor's
reader of them; and the measured cost of loading a source's work units (``unit-cost`` records on the
source's plan topic).

A change is the JSON record ``{"kind": "mixture-change", "id": ..., "from_step": K, "shares": {...}}``
with key ``mixture-change``. The constructor reads the control topic from the offset in its last state
record before each step, accepts or refuses each change it finds (``pipeline.planning.mixing.refusal``), and
records both in the state record of the step it writes next, in the same transaction: a restart
re-reads the same records from the same offset and decides the same way.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from pipeline.planning.mixing import MixtureChange
from topics.errors import DecodeError, MixflowError
from topics.formats.json_record import decode, encode, json_record
from topics.formats.names import JobTopics
from topics.kafka.authorization import raise_if_read_refused
from topics.kafka.clients import KafkaConfig, produce, read_committed_settings
from topics.kafka.log_reader import read_to_end
from topics.kafka.renewing_consumer import RenewingConsumer

if TYPE_CHECKING:  # pipeline.roles.constructor imports this module
    from pipeline.planning.step.state import ConstructorState

log = logging.getLogger(__name__)

SPEC_KEY = b"spec"
"""The key of the spec records (``pipeline.kafka.spec_record``), which do not move the control offset."""
MIXTURE_CHANGE_KIND = "mixture-change"
MIXTURE_CHANGE_KEY = MIXTURE_CHANGE_KIND.encode()


def encode_mixture_change(change: MixtureChange) -> tuple[bytes, bytes]:
    """The key and value of ``change``'s control record."""
    return MIXTURE_CHANGE_KEY, encode(change, kind=MIXTURE_CHANGE_KIND, separators=None)


def decode_mixture_change(value: bytes) -> MixtureChange:
    """The change in a ``mixture-change`` record's value; ``DecodeError`` saying what is wrong otherwise."""
    return decode(MixtureChange, value)


def new_change_id() -> str:
    return uuid.uuid4().hex[:12]


def publish_mixture_change(config: KafkaConfig, topics: JobTopics, change: MixtureChange) -> int:
    """Append ``change`` to the job's control topic; returns its offset."""
    producer = Producer({**config, "enable.idempotence": True})
    key, value = encode_mixture_change(change)
    offsets: list[int] = []
    errors: list[KafkaError] = []

    def delivered(error: KafkaError | None, message: object) -> None:
        if error is not None:
            errors.append(error)
        else:
            offsets.append(message.offset())  # type: ignore[attr-defined]

    produce(producer, topics.control, value, key=key, on_delivery=delivered)
    if producer.flush(60) or errors:
        msg = f"publishing mixture change {change.id} to {topics.control} failed: {errors[:1] or 'timed out'}"
        raise MixflowError(msg)
    return offsets[0]


def first_changeable_step(states: Sequence[ConstructorState | None]) -> int:
    """The first step a mixture change may start from so that every constructor lane accepts it, from each
    lane's last state (None: the lane has written nothing yet). A lane refuses a change from a step it
    has written or an earlier one (its state's step is the next it builds, its last plus the number of
    lanes), so this is just past the highest step any lane has written."""
    return max((s.step - len(states) + 1 for s in states if s is not None), default=0)


def lanes_finished(states: Sequence[ConstructorState | None]) -> bool:
    """Every lane has written its last step (a job without lanes: its constructor has)."""
    return bool(states) and all(s is not None and s.finished for s in states)


def change_answer(states: Sequence[ConstructorState | None], change_id: str) -> str | None:
    """``refused`` once any lane's state says it refused the change; ``accepted`` once every lane that has
    not finished (and at least one lane) says it accepted it; None while some lane has not read it yet."""
    if any(s is not None and change_id in s.refused for s in states):
        return "refused"
    accepted = [s is not None and any(c.id == change_id for c in s.changes) for s in states]
    open_lanes = [took for took, s in zip(accepted, states, strict=True) if s is None or not s.finished]
    return "accepted" if any(accepted) and all(open_lanes) else None


@dataclass(frozen=True)
class ControlRecord:
    """A mixture change read at ``offset``, or None for a record of another kind or one that is broken
    (``problem`` says why)."""

    offset: int
    change: MixtureChange | None
    problem: str | None = None


class ControlReader:
    """The constructor's reader of ``<job>.control`` (read_committed), from a given offset on."""

    def __init__(self, config: KafkaConfig, topics: JobTopics, offset: int) -> None:
        self.topic = topics.control
        group = f"{topics.job}.constructor.control"
        self.settings = read_committed_settings(config, group, **{"enable.partition.eof": True})
        self.consumer = RenewingConsumer(self.settings)
        self.consumer.assign([TopicPartition(self.topic, 0, offset)])
        self.next_offset = offset
        self._at_end = False

    def read_available(self, wait_s: float = 0.0) -> list[ControlRecord]:
        """The records that have arrived since the last call; waits up to ``wait_s`` for the first
        fetch to reach the end of the topic."""
        out: list[ControlRecord] = []
        deadline = time.monotonic() + wait_s
        while True:
            messages = self.consumer.consume(num_messages=500, timeout=0 if self._at_end else 0.05)
            for message in messages:
                if message.error():
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        self._at_end = True
                        continue
                    raise_if_read_refused(self.settings, message.error(), self.topic)
                    raise KafkaException(message.error())
                self._at_end = False
                if message.key() != SPEC_KEY:  # see pipeline.kafka.spec_record
                    self.next_offset = message.offset() + 1
                out.append(self._record(message.offset(), message.key(), message.value()))
            if self._at_end or (not messages and time.monotonic() >= deadline):
                return out

    def _record(self, offset: int, key: bytes | None, value: bytes | None) -> ControlRecord:
        if key != MIXTURE_CHANGE_KEY:
            return ControlRecord(offset, None)
        try:
            return ControlRecord(offset, decode_mixture_change(value or b""))
        except DecodeError as exc:
            return ControlRecord(offset, None, str(exc.at(self.topic, 0, offset)))

    def close(self) -> None:
        self.consumer.close()


@dataclass(frozen=True)
class BrokenControlRecord:
    """A committed record of ``<job>.control`` of a kind that steers the job (a mixture change, a spec record)
    that does not decode: every reader skips it as if it were not there."""

    offset: int
    key: str
    problem: str
    timestamp_ms: int


def broken_control_records(config: KafkaConfig, topics: JobTopics) -> list[BrokenControlRecord]:
    """The records of ``topics.control`` that steer the job and do not decode, in offset order."""
    from pipeline.planning.step.spec_in_force import SpecRecord

    decoders = {MIXTURE_CHANGE_KEY: decode_mixture_change, SPEC_KEY: lambda value: decode(SpecRecord, value)}
    out = []
    for message in read_to_end(config, topics.control):
        if (decoder := decoders.get(message.key() or b"")) is None:
            continue
        try:
            decoder(message.value() or b"")
        except DecodeError as exc:
            key = (message.key() or b"").decode()
            out.append(BrokenControlRecord(message.offset(), key, exc.reason, message.timestamp()[1]))
    return out


UNIT_COST_KIND = "unit-cost"


@json_record("unit cost")
@dataclass(frozen=True)
class UnitCost:
    """``seconds`` spent loading ``bytes`` of a source (the units' ``estimated_bytes``, the size planning
    uses) over ``units`` units: reading, tokenizing, encoding and producing them.

    The JSON form is ``{"kind": "unit-cost", "source", "bytes", "seconds", "units", "measured_by"}``, keyed
    ``unit-cost/<source>``. A loader writes one in each transaction of its units (with a source's
    ``unit_target_s`` set), and the planner writes its own measurement with the plan. A source's cost is
    the sum of its records (:func:`read_unit_cost`): a new loader, or the next epoch's planner, starts
    from it instead of measuring again."""

    source: str
    bytes: int
    seconds: float
    units: int = 1
    measured_by: str = ""

    def __post_init__(self) -> None:
        if self.bytes < 0 or not (self.seconds >= 0 and math.isfinite(self.seconds)) or self.units < 0:
            msg = f"unit cost of {self.source}: bytes, seconds and units must be finite and >= 0"
            raise ValueError(msg)

    @property
    def seconds_per_byte(self) -> float | None:
        """The measured cost, or None before anything with content was measured."""
        return self.seconds / self.bytes if self.bytes and self.seconds else None

    def plus(self, other: UnitCost) -> UnitCost:
        return replace(
            self, bytes=self.bytes + other.bytes, seconds=self.seconds + other.seconds, units=self.units + other.units
        )

    def to_json(self) -> bytes:
        return encode(self, kind=UNIT_COST_KIND, separators=None)

    @classmethod
    def from_json(cls, data: bytes) -> UnitCost:
        return decode(cls, data)


def unit_cost_key(source: str) -> bytes:
    return f"{UNIT_COST_KIND}/{source}".encode()


def plan_records(config: KafkaConfig, topics: JobTopics, source: str, key: bytes) -> list[Message]:
    """The committed records keyed ``key`` on ``source``'s plan topic, in order; for a job whose loaders wrote
    them to the control topic and nothing to the plan topic yet, those there."""
    own = [m for m in read_to_end(config, topics.plan(source)) if m.key() == key]
    return own or [m for m in read_to_end(config, topics.control) if m.key() == key]


def read_unit_cost(config: KafkaConfig, topics: JobTopics, source: str) -> UnitCost | None:
    """The sum of the committed ``unit-cost`` records of ``source``, or None when there is none. A broken
    record is skipped with a warning: the cost is an estimate, and the next measurement replaces it."""
    total: UnitCost | None = None
    for message in plan_records(config, topics, source, unit_cost_key(source)):
        try:
            cost = UnitCost.from_json(message.value() or b"")
        except DecodeError as exc:
            log.warning("%s[%d]@%d: %s", message.topic(), message.partition(), message.offset(), exc)
            continue
        total = cost if total is None else total.plus(cost)
    return total


def shares_from_arguments(pairs: list[str], sources: Mapping[str, object]) -> dict[str, float]:
    """``["code=0.3", "web=0.7"]`` as shares; ``MixflowError`` naming the bad argument otherwise."""
    shares: dict[str, float] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            msg = f"{pair!r}: give SOURCE=SHARE"
            raise MixflowError(msg)
        if name not in sources:
            msg = f"{pair!r}: the job mixes no source {name!r} (it mixes {', '.join(sources)})"
            raise MixflowError(msg)
        try:
            share = float(value)
        except ValueError:
            share = float("nan")
        if not share >= 0 or share == float("inf"):
            msg = f"{pair!r}: a share must be a finite number >= 0"
            raise MixflowError(msg)
        if name in shares:
            msg = f"{pair!r}: source {name!r} is given twice"
            raise MixflowError(msg)
        shares[name] = share
    if not shares or sum(shares.values()) <= 0:
        msg = "give at least one SOURCE=SHARE with a share above 0"
        raise MixflowError(msg)
    return shares
