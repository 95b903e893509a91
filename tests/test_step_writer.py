"""The constructor's ``StepWriter`` against the real broker: each step's whole transaction runs on the
writer's thread, one after another; an aborted step makes the next hand-over refuse (the caller rewinds
to the last committed step), and fencing reaches the main thread."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from pipeline.kafka.role_protocol import TransactionalRole
from pipeline.roles.constructor.writer import PreparedStep, Record, StepWriter
from tests.kafka_support import create_topic, read_to_end
from topics.kafka.clients import (
    KafkaConfig,
    ProducerFencedError,
    abort,
    read_committed_consumer,
    transactional_producer,
)


class AbortingRole(TransactionalRole):
    """A role whose transactions abort, on the broker, once each for the steps named in ``abort_once``,
    as ``open_transaction`` aborts on a retriable or abortable Kafka error."""

    kind = "test"

    def __init__(self, config: KafkaConfig, transactional_id: str, abort_once: set[str]) -> None:
        super().__init__(config, transaction_timeout_ms=60_000)
        self._transactional_id = transactional_id
        self.abort_once = abort_once

    @property
    def transactional_id(self) -> str:
        return self._transactional_id

    def open_transaction(
        self, producer: Producer, consumer: Consumer | None, work: Callable[[], list[TopicPartition]], what: str
    ) -> bool:
        if not super().open_transaction(producer, consumer, work, what):
            return False
        if named := self.abort_once & _steps_named(what):
            self.abort_once.discard(min(named, key=lambda n: int(n.split()[1])))
            abort(producer)
            return False
        return True


def _steps_named(what: str) -> set[str]:
    """The steps of a transaction: "step 3", or "step 3 to step 5" for a group."""
    first, _, last = what.partition(" to ")
    a, b = int(first.split()[1]), int((last or first).split()[1])
    return {f"step {k}" for k in range(a, b + 1)}


def _step(topic: str, source: str, k: int, records: int, done: list[int]) -> PreparedStep:
    headers = [("step", str(k).encode())]
    values = [Record(topic, f"{k}:{i}".encode(), str(k).encode(), headers, 0) for i in range(records)]
    return PreparedStep(f"step {k}", values, [TopicPartition(source, 0, k + 1)], done=lambda: done.append(k))


@pytest.fixture
def writing(kafka_bootstrap: str, unique_name: str):
    config = {"bootstrap.servers": kafka_bootstrap}
    topic, source, group = f"{unique_name}.out", f"{unique_name}.src", f"{unique_name}.writer"
    create_topic(kafka_bootstrap, topic)
    create_topic(kafka_bootstrap, source)
    producer = transactional_producer(config, group, transaction_timeout_ms=60_000)
    consumer = read_committed_consumer(config, group)
    yield config, topic, source, group, producer, consumer
    consumer.close()


@pytest.mark.parametrize(
    ("steps", "records", "aborted", "per_transaction"),
    [
        (6, 1, set(), 1),
        (6, 40, {0}, 1),
        (8, 5, {3}, 1),
        (8, 17, {1, 2, 6}, 1),
        (5, 200, {4}, 1),
        (7, 3, set(), 3),
        (8, 17, {1, 2, 6}, 3),
        (9, 5, {8}, 4),
        (6, 20, {0, 5}, 6),
    ],
)
def test_steps_commit_in_order_and_an_abort_rewinds_to_the_last_committed(
    writing, steps: int, records: int, aborted: set[int], per_transaction: int
) -> None:
    config, topic, source, group, producer, consumer = writing
    role = AbortingRole(config, group, {f"step {k}" for k in aborted})
    ended: list[bool] = []
    writer = StepWriter(role, producer, consumer, lambda committed, seconds: ended.append(committed), per_transaction)
    done: list[int] = []
    handed: list[PreparedStep] = []
    k, refused = 0, 0
    deadline = time.monotonic() + 60
    while True:
        while k < steps:
            assert time.monotonic() < deadline, f"steps did not finish in 60 s: done {done}"
            handed.append(_step(topic, source, k, records, done))
            if writer.write(handed[-1]):
                k += 1
            else:  # as the constructor does: drop the prepared steps, resume after the last committed one
                refused += 1
                k = done[-1] + 1 if done else 0
        if writer.wait():
            break
        refused += 1
        k = done[-1] + 1 if done else 0
    writer.close()

    assert done == list(range(steps))
    committed = {step.what: step for step in handed}  # each step's last attempt: the one committed
    assert not any(step.records for step in committed.values()), "produced records are held past their transaction"
    assert refused == len(aborted)
    assert sorted(ended) == [False] * len(aborted) + [True] * -(-steps // per_transaction)
    values = [m.value().decode() for m in read_to_end(config["bootstrap.servers"], topic)]
    assert values == [f"{s}:{i}" for s in range(steps) for i in range(records)]
    [committed] = consumer.committed([TopicPartition(source, 0)], timeout=30)
    assert committed.offset == steps


def test_an_aborted_step_is_seen_without_handing_over_another(writing) -> None:
    config, topic, source, group, producer, consumer = writing
    writer = StepWriter(AbortingRole(config, group, {"step 1"}), producer, consumer)
    done: list[int] = []
    assert writer.write(_step(topic, source, 0, 3, done))
    assert writer.write(_step(topic, source, 1, 3, done))
    assert done == [0]
    deadline = time.monotonic() + 30
    while (settled := writer.poll()) and writer.in_flight:
        assert time.monotonic() < deadline, "the transaction of step 1 did not end in 30 s"
        time.sleep(0.01)  # poll interval
    assert not settled and not writer.in_flight
    assert writer.wait()  # nothing in flight any more
    writer.close()
    assert [m.value().decode() for m in read_to_end(config["bootstrap.servers"], topic)] == ["0:0", "0:1", "0:2"]


def test_a_fenced_writer_raises_on_the_main_thread_and_writes_nothing_more(writing) -> None:
    config, topic, source, group, producer, consumer = writing
    writer = StepWriter(AbortingRole(config, group, set()), producer, consumer)
    done: list[int] = []
    assert writer.write(_step(topic, source, 0, 2, done)) and writer.wait()
    transactional_producer(config, group, transaction_timeout_ms=60_000)  # a newer process of the role
    assert writer.write(_step(topic, source, 1, 2, done))
    with pytest.raises(ProducerFencedError, match="fenced"):
        writer.write(_step(topic, source, 2, 2, done))  # handed over while the transaction before fails
    # The constructor's cleanup waits for the writer while the error goes up: it starts nothing more on the
    # fenced producer (that raised a conflicting-call error, which hid the fencing from the caller).
    assert writer.wait()
    writer.close()
    assert done == [0]
    assert [m.value().decode() for m in read_to_end(config["bootstrap.servers"], topic)] == ["0:0", "0:1"]


def test_a_partial_group_goes_out_on_flush_and_waits_for_the_group_before(writing) -> None:
    config, topic, source, group, producer, consumer = writing
    writer = StepWriter(AbortingRole(config, group, set()), producer, consumer, steps_per_transaction=4)
    done: list[int] = []
    for k in range(2):
        assert writer.write(_step(topic, source, k, 2, done))
    assert writer.in_flight == 2 and done == []
    assert writer.flush()  # the writer thread is free: steps 0 and 1 go out as one transaction
    for k in range(2, 5):
        assert writer.write(_step(topic, source, k, 2, done))
    assert writer.in_flight == 5
    deadline = time.monotonic() + 30
    while done != [0, 1]:
        assert time.monotonic() < deadline, "the flushed transaction of steps 0 and 1 did not end in 30 s"
        assert writer.poll()
        time.sleep(0.01)  # poll interval
    assert writer.wait() and done == [0, 1, 2, 3, 4]
    writer.close()
    values = [m.value().decode() for m in read_to_end(config["bootstrap.servers"], topic)]
    assert values == [f"{s}:{i}" for s in range(5) for i in range(2)]
    [committed] = consumer.committed([TopicPartition(source, 0)], timeout=30)
    assert committed.offset == 5
