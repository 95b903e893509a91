"""Where a rank's reader starts: how many lanes (partitions) its rank topic has, waiting for a topic not
created yet, and in each partition the offset of the position's step (``topics/kafka/step_index.py``)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer

from topics.errors import MixflowError
from topics.formats.lanes import first_step_at_or_after
from topics.kafka.step_index import locate_step
from trainer_sink.position import SinkPosition
from trainer_sink.read_options import ReadOptions
from trainer_sink.steps import POLL_S, SinkTimeoutError

log = logging.getLogger(__name__)


def rank_topic_lanes(
    config: Mapping[str, Any], rank: int, topic: str, options: ReadOptions, stopped: threading.Event
) -> int | None:
    """The partitions of ``topic``: the job's constructor lanes. Waits (up to the wait timeout) for a topic
    not created yet; None once ``stopped`` is set."""
    admin = Consumer({**config, "group.id": f"mixflow-sink-meta-{uuid.uuid4().hex[:12]}"})
    try:
        began = last_log = time.monotonic()
        while not stopped.is_set():
            described = admin.list_topics(topic, timeout=10).topics.get(topic)
            if described is not None and described.error is None and described.partitions:
                return len(described.partitions)
            if time.monotonic() - began > options.wait_timeout_s:
                msg = f"rank topic {topic} does not exist after {options.wait_timeout_s:.0f} s"
                raise SinkTimeoutError(msg)
            if time.monotonic() - last_log > options.wait_log_interval_s:
                log.warning("rank %d has waited %.0f s for %s to exist", rank, time.monotonic() - began, topic)
                last_log = time.monotonic()
            stopped.wait(POLL_S)  # a topic that does not exist yet has nothing to wait on
        return None
    finally:
        admin.close()


def start_offsets(kafka_config: Mapping[str, Any], position: SinkPosition, lanes: int) -> dict[int, int]:
    """Per partition of the rank topic, where reading starts."""
    if lanes == 1:
        return {position.partition: _start_offset(kafka_config, position)}
    return _lane_offsets(kafka_config, position, lanes)


def _lane_offsets(kafka_config: Mapping[str, Any], position: SinkPosition, lanes: int) -> dict[int, int]:
    """Per partition, where reading starts: its first record of the position's step or a later one, or its
    end-of-data record (a lane that ended before that step)."""
    topic, step = position.topic, position.step
    if step is None:
        return dict.fromkeys(range(lanes), OFFSET_BEGINNING)
    offsets = {}
    for lane in range(lanes):
        wanted = first_step_at_or_after(step, lane, lanes)
        offsets[lane] = locate_step(kafka_config, topic, wanted, partition=lane, stop_at_end=True).offset
    return offsets


def _start_offset(kafka_config: Mapping[str, Any], position: SinkPosition) -> int:
    """Where reading starts: the position's offset, or for a position carried over from another topic the
    record of its step, found by step number (see ``topics.kafka.step_index``)."""
    topic, step = position.topic, position.step
    if position.offset is not None or step is None:
        return OFFSET_BEGINNING if position.offset is None else position.offset
    location = locate_step(kafka_config, topic, step, partition=position.partition)
    record = location.record
    if record is None:
        log.info("%s holds no step %d yet; waiting for it", topic, step)
    elif record.end and record.step < step:
        msg = f"cannot resume at step {step} on {topic}: its job ended after {record.step} steps"
        raise MixflowError(msg)
    elif record.step > step:
        first = f"the end of the job after {record.step} steps" if record.end else f"step {record.step}"
        msg = f"cannot resume at step {step} on {topic}: it holds no step {step}; the first record after is {first}"
        raise MixflowError(msg)
    return location.offset
