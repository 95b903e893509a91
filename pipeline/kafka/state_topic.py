"""The constructor's state topic, ``<job>.state``, read back: each committed record decoded once
(``StateRecord``), the last state of each constructor lane (one partition each), a job's whole history for
a replay or a report (``JobHistory``), and the step shape of the job's last batch (``<job>.rank.0``).

A record's key is the step written in its transaction (the record that ends a job repeats the last step's
key); its state is the constructor's after that step, so ``state.step`` is the lane's next step."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from confluent_kafka import Message

from pipeline.planning.shape import StepShape
from pipeline.planning.step.state import ConstructorState
from topics.errors import DecodeError, NotFoundError
from topics.formats.batch_codec import decode_any_batch_message, end_of_data_steps
from topics.formats.names import JobTopics
from topics.kafka.admin import bootstrap_servers, topic_exists
from topics.kafka.clients import KafkaConfig
from topics.kafka.log_reader import read_to_end

# Offsets at the end of the state topic that hold its last record (each step adds a record and a
# transaction marker; aborted attempts add a few more).
STATE_TAIL = 64


@dataclass(frozen=True, slots=True)
class StateRecord:
    """One committed record of ``<job>.state``: the state decoded, its key and value as written, and its Kafka
    timestamp."""

    state: ConstructorState
    key: bytes | None
    value: bytes
    timestamp_ms: int = 0

    @property
    def step(self) -> int:
        """The step written in the record's transaction (its key; -1 for a record without one)."""
        return int(self.key or b"-1")

    @property
    def time_s(self) -> float:
        """When the record was written, seconds since the epoch."""
        return self.timestamp_ms / 1000.0

    @property
    def delivered(self) -> dict[str, int]:
        """Per source, the offsets below which everything is delivered, plus those delivered above."""
        return {s: p.low + len(p.used) for s, p in self.state.positions.items()}


def decode_state(message: Message) -> ConstructorState:
    """The state a record of the state topic holds; ``DecodeError`` naming the record's place otherwise."""
    try:
        return ConstructorState.from_bytes(message.value())
    except DecodeError as exc:
        raise exc.at(message.topic(), message.partition(), message.offset()) from exc


def state_record(message: Message) -> StateRecord:
    """``message``, a record of the state topic, decoded."""
    return StateRecord(decode_state(message), message.key(), message.value(), message.timestamp()[1])


def last_records(config: KafkaConfig, topics: JobTopics, timeout_s: float = 60.0) -> dict[int, Message]:
    """The last committed record of each constructor lane that wrote one, by lane. ``TimeoutError`` (or
    ``KafkaUnavailableError``) when they cannot be read within ``timeout_s``."""
    # read_to_end returns each partition in offset order: the last record of each partition wins.
    return {r.partition(): r for r in read_to_end(config, topics.state, tail=STATE_TAIL, timeout_s=timeout_s)}


def read_last_state(
    config: KafkaConfig, topics: JobTopics, lane: int = 0, timeout_s: float = 60.0
) -> ConstructorState | None:
    """The state in the last committed state record of the job's ``lane``; None before its first step."""
    last = last_records(config, topics, timeout_s).get(lane)
    return decode_state(last) if last is not None else None


def read_lane_states(config: KafkaConfig, topics: JobTopics, lanes: int) -> list[ConstructorState | None]:
    """The last committed state of each of the job's ``lanes`` constructor lanes (None: none yet)."""
    last = last_records(config, topics)
    return [decode_state(last[lane]) if lane in last else None for lane in range(lanes)]


def read_state_records(config: KafkaConfig, topics: JobTopics) -> list[StateRecord]:
    """Every committed record of the job's state topic, each lane's in the order written (lane by lane)."""
    return [state_record(message) for message in read_to_end(config, topics.state)]


def first_per_step(records: list[StateRecord]) -> list[StateRecord]:
    """The first record written for each step (the record that ends a job repeats the last step's key), in
    step order."""
    out: dict[int, StateRecord] = {}
    for record in records:
        if record.step >= 0 and record.step not in out:
            out[record.step] = record
    return [out[k] for k in sorted(out)]


def written_shape(config: KafkaConfig, topics: JobTopics, lane: int = 0) -> StepShape | None:
    """The step shape (its written part, ``StepShape.written``) of the last batch ``lane`` wrote to rank 0;
    None before its first step."""
    topic = topics.rank(0)
    if not topic_exists(config, topic):
        return None
    records = [
        r
        for r in read_to_end(config, topic, tail=8)
        if r.partition() == lane and end_of_data_steps(r.headers()) is None
    ]
    if not records:
        return None
    last = decode_any_batch_message(records[-1])
    return StepShape.of_batch(last)


@dataclass(frozen=True)
class JobHistory:
    """A job's committed state records, oldest first, and the shape of the steps on its rank topics."""

    job: str
    records: tuple[StateRecord, ...]
    shape: StepShape | None

    @property
    def steps(self) -> int:
        """The number of steps written (0 to ``steps - 1``)."""
        return self.records[-1].state.step if self.records else 0

    @property
    def finished(self) -> bool:
        """Whether the job ended (its rank topics end with an end-of-data record)."""
        return bool(self.records) and self.records[-1].state.finished

    @property
    def last(self) -> StateRecord | None:
        return self.records[-1] if self.records else None

    def before(self, step: int) -> StateRecord | None:
        """The state step ``step`` was written from: the last record, short of the final one, whose next
        step is ``step`` (the one of step ``step - 1``'s transaction, or a later one that only accepted
        mixture changes). None when there is none, as before step 0."""
        return self._last_by_step.get(step)

    @cached_property
    def _last_by_step(self) -> dict[int, StateRecord]:
        return {r.state.step: r for r in self.records if not r.state.finished}

    def first_step_after(self, timestamp_ms: int) -> int | None:
        """The step of the first state record written at or after ``timestamp_ms`` (None: none was)."""
        for record in self.records:
            if record.timestamp_ms >= timestamp_ms:
                return record.state.step - 1
        return None

    def final(self) -> StateRecord | None:
        """The state record written with the end-of-data records, if the job ended."""
        return self.records[-1] if self.finished else None


def read_history(config: KafkaConfig, job: str) -> JobHistory | None:
    """``job``'s history, or None when it has no state topic (no such job, or none that wrote a step)."""
    topics = JobTopics(job)
    if not topic_exists(config, topics.state):
        return None
    records = tuple(read_state_records(config, topics))
    # A state record commits with the step's batches: with none, there are no batches to look at either.
    return JobHistory(job, records, written_shape(config, topics) if records else None)


def require_history(config: KafkaConfig, job: str) -> JobHistory:
    """``job``'s history; ``NotFoundError`` when the job has written no step."""
    history = read_history(config, job)
    if history is None or history.shape is None or not history.steps:
        where = bootstrap_servers(config)
        msg = f"job {job} has written no step at {where} (no state records on {JobTopics(job).state}): no such job?"
        raise NotFoundError(msg)
    return history
