"""Reading what a job wrote: the last committed constructor state (``<job>.state``) and the step shape
of its last batch (``<job>.rank.0``), each in the partition of one constructor lane (0 without lanes)."""

from __future__ import annotations

from pipeline.kafka.clients import KafkaConfig
from pipeline.planning.step.spec_change import StepShape
from pipeline.planning.step.state import ConstructorState
from topics.admin import topic_exists
from topics.batch_codec import decode_batch_message, end_of_data_steps
from topics.errors import DecodeError
from topics.log_reader import read_to_end
from topics.names import JobTopics

# Offsets at the end of the state topic that hold its last record (each step adds a record and a
# transaction marker; aborted attempts add a few more).
STATE_TAIL = 64


def read_last_state(
    config: KafkaConfig, topics: JobTopics, lane: int = 0, timeout_s: float = 60.0
) -> ConstructorState | None:
    """The state in the last committed state record of the job's ``lane``; None before its first step.
    ``TimeoutError`` (or ``KafkaUnavailableError``) when it cannot be read within ``timeout_s``."""
    records = [
        r for r in read_to_end(config, topics.state, tail=STATE_TAIL, timeout_s=timeout_s) if r.partition() == lane
    ]
    if not records:
        return None
    last = records[-1]
    try:
        return ConstructorState.from_bytes(last.value())
    except DecodeError as exc:
        raise exc.at(last.topic(), last.partition(), last.offset()) from exc


def written_shape(config: KafkaConfig, topics: JobTopics, lane: int = 0) -> StepShape | None:
    """The step shape of the last batch ``lane`` wrote to rank 0; None before its first step."""
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
    last = decode_batch_message(records[-1])
    return StepShape(last.ranks, last.micro_batches, last.capacity)
