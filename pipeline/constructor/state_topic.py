"""Reading a job's state topic (``<job>.state``): the last committed constructor state."""

from __future__ import annotations

from pipeline.constructor.state import ConstructorState
from pipeline.kafka_clients import KafkaConfig
from topics.errors import DecodeError
from topics.log_reader import read_to_end
from topics.names import JobTopics

# Offsets at the end of the state topic that hold its last record (each step adds a record and a
# transaction marker; aborted attempts add a few more).
STATE_TAIL = 64


def read_last_state(config: KafkaConfig, topics: JobTopics) -> ConstructorState | None:
    """The state in the job's last committed state record; None before its first step."""
    records = read_to_end(config, topics.state, tail=STATE_TAIL)
    if not records:
        return None
    last = records[-1]
    try:
        return ConstructorState.from_bytes(last.value())
    except DecodeError as exc:
        raise exc.at(last.topic(), last.partition(), last.offset()) from exc
