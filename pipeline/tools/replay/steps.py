"""Read a job's rank topics step by step, every rank's record of a step together."""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from topics.errors import DecodeError, MixflowError
from topics.formats.names import JobTopics
from topics.kafka.clients import KafkaConfig
from topics.kafka.librdkafka_log import logged
from topics.kafka.step_index import locate_step, step_record

READ_AHEAD_BYTES = 64 * 1024 * 1024
"""Bytes read ahead on one rank topic, while another's next record has not come, before it is paused."""


@dataclass(frozen=True)
class StepMessages:
    """Every rank's record of ``step``, in rank order; with ``end``, the end-of-data records that follow
    the last step (``step`` is then the number of steps)."""

    step: int
    messages: list[Message]
    end: bool = False


def read_steps(
    config: KafkaConfig, job: str, ranks: int, first: int, last: int, *, end: bool, timeout_s: float = 60.0
) -> Iterator[StepMessages]:
    """Steps ``first`` to ``last`` of ``job``'s ``ranks`` rank topics, then, with ``end``, its end-of-data
    records. Raises ``MixflowError`` naming the topic when a record is not the one due, and when a topic
    gives nothing new for ``timeout_s``."""
    topics = [JobTopics(job).rank(r) for r in range(ranks)]
    # Located before the consumer exists: a consumer left idle that long was seen to fetch 1 s late.
    starts = [TopicPartition(t, 0, locate_step(config, t, first).offset) for t in topics]
    consumer = Consumer(
        {
            **logged(config),
            "group.id": f"mixflow-replay-reader-{uuid.uuid4().hex[:12]}",  # never joined or committed
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "queued.max.messages.kbytes": 32_768,
            # A topic read to its end must not hold up the others' records for the broker's default 500 ms,
            # and a full read-ahead queue must not stall fetching for librdkafka's default 1 s.
            "fetch.wait.max.ms": 20,
            "fetch.queue.backoff.ms": 10,
        }
    )
    try:
        consumer.assign(starts)
        pending: dict[str, deque[Message]] = {t: deque() for t in topics}
        held = dict.fromkeys(topics, 0)  # bytes in pending
        paused: set[str] = set()
        due, deadline = first, time.monotonic() + timeout_s
        while due <= last or end:
            if all(pending.values()):
                messages = [pending[t].popleft() for t in topics]
                for topic, message in zip(topics, messages, strict=True):
                    held[topic] -= len(message.value() or b"")
                yield _check(messages, due, last)
                if due > last:
                    return
                due, deadline = due + 1, time.monotonic() + timeout_s
                continue
            first_message = consumer.poll(0.2)
            arrived = [] if first_message is None else [first_message, *consumer.consume(num_messages=500, timeout=0)]
            for message in arrived:
                if message.error():
                    raise KafkaException(message.error())
                pending[message.topic()].append(message)
                held[message.topic()] += len(message.value() or b"")
            full = {t for t in topics if held[t] > READ_AHEAD_BYTES}
            if pause := full - paused:
                consumer.pause([TopicPartition(t, 0) for t in pause])
            if resume := paused - full:
                consumer.resume([TopicPartition(t, 0) for t in resume])
            paused = full
            if time.monotonic() > deadline:
                missing = ", ".join(t for t in topics if not pending[t])
                what = f"step {due}" if due <= last else "the end-of-data record"
                msg = f"reading job {job}: no {what} on {missing} after {timeout_s:.0f} s"
                raise MixflowError(msg)
    finally:
        consumer.close()


def _check(messages: list[Message], due: int, last: int) -> StepMessages:
    """The records of one step, checked to be step ``due`` (or, past ``last``, the end of the job after it)."""
    for message in messages:
        record = step_record(message)
        found = f"the end of the job after {record.step} steps" if record.end else f"step {record.step}"
        expected = f"the end of the job after {due} steps" if due > last else f"step {due}"
        if record.end != (due > last) or record.step != due:
            where = {"topic": message.topic(), "partition": message.partition(), "offset": message.offset()}
            raise DecodeError(f"expected {expected}, found {found}", **where)
    return StepMessages(due, messages, end=due > last)
