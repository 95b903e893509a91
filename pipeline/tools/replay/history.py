"""What a job has written, read back for a replay: its state records in order and the shape of its steps."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from pipeline.kafka.clients import KafkaConfig
from pipeline.kafka.state_topic import written_shape
from pipeline.planning.step.spec_change import StepShape
from pipeline.planning.step.state import ConstructorState
from topics.admin import bootstrap_servers, topic_exists
from topics.errors import DecodeError, NotFoundError
from topics.log_reader import read_to_end
from topics.names import JobTopics


@dataclass(frozen=True)
class StateRecord:
    """One committed record of ``<job>.state``: the state decoded, its key and value as written, and its Kafka
    timestamp."""

    state: ConstructorState
    key: bytes | None
    value: bytes
    timestamp_ms: int = 0


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
    records = []
    for message in read_to_end(config, topics.state):
        try:
            state = ConstructorState.from_bytes(message.value())
        except DecodeError as exc:
            raise exc.at(message.topic(), message.partition(), message.offset()) from exc
        records.append(StateRecord(state, message.key(), message.value(), message.timestamp()[1]))
    # A state record commits with the step's batches: with none, there are no batches to look at either.
    return JobHistory(job, tuple(records), written_shape(config, topics) if records else None)


def require_history(config: KafkaConfig, job: str) -> JobHistory:
    """``job``'s history; ``NotFoundError`` when the job has written no step."""
    history = read_history(config, job)
    if history is None or history.shape is None or not history.steps:
        where = bootstrap_servers(config)
        msg = f"job {job} has written no step at {where} (no state records on {JobTopics(job).state}): no such job?"
        raise NotFoundError(msg)
    return history


def adopted(state: ConstructorState) -> ConstructorState:
    """``state`` of the original job as a state of the replayed one: everything that decides the samples
    stays, but its control topic is the replayed job's own, read from its start."""
    return replace(state, control_offset=0, refused=())
