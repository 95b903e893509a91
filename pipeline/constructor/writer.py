"""The constructor's writing of steps, pipelined: the commit of step k runs on a thread while the
main thread reads, plans and encodes step k+1. Transactions still follow one another (a transactional
producer has one open at a time), so what is written and its exactly-once guarantee are unchanged; only
the wait for the broker's answer overlaps the next step's work."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from confluent_kafka import Consumer, Producer, TopicPartition

from pipeline.kafka_clients import commit_or_abort, produce
from pipeline.role_protocol import TransactionalRole

Record = tuple[str, bytes, bytes, list[tuple[str, bytes]] | None]  # topic, value, key, headers


@dataclass
class PreparedStep:
    """Everything one step's transaction writes, encoded before the transaction begins."""

    what: str
    records: list[Record]
    offsets: list[TopicPartition]
    done: Callable[[], None] = field(default=lambda: None)  # called once the step is committed


class StepWriter:
    """Writes prepared steps in order, one transaction each, committing each in the background."""

    def __init__(self, role: TransactionalRole, producer: Producer, consumer: Consumer) -> None:
        self.role = role
        self.producer = producer
        self.consumer = consumer
        self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="step-commit")
        self._in_flight: tuple[PreparedStep, Future[bool]] | None = None

    def write(self, step: PreparedStep) -> bool:
        """Wait for the step before to commit, then open ``step``'s transaction and start its commit.
        False when the step before or this one was aborted: the caller resumes from the last
        committed state."""
        if not self.wait():
            return False

        def produce_records() -> list[TopicPartition]:
            for topic, value, key, headers in step.records:
                produce(self.producer, topic, value, key=key, headers=headers)
            return step.offsets

        if not self.role.open_transaction(self.producer, self.consumer, produce_records, step.what):
            return False
        self._in_flight = (step, self._committer.submit(commit_or_abort, self.producer))
        return True

    @property
    def in_flight(self) -> int:
        """1 while a step's commit is under way, else 0."""
        return int(self._in_flight is not None)

    def wait(self) -> bool:
        """Wait for the step in flight, if any; True when it committed (or none was in flight)."""
        if self._in_flight is None:
            return True
        step, commit = self._in_flight
        self._in_flight = None
        if not commit.result():
            return False
        step.done()
        return True

    def close(self) -> None:
        self._committer.shutdown(wait=True)
