"""The constructor's writing of steps, pipelined: the commit of step k runs on a thread while the
main thread reads, plans and encodes step k+1. Transactions still follow one another (a transactional
producer has one open at a time), so what is written and its exactly-once guarantee are unchanged; only
the wait for the broker's answer overlaps the next step's work."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from confluent_kafka import Consumer, Producer, TopicPartition

from pipeline.kafka_clients import commit_or_abort, produce
from pipeline.role_protocol import TransactionalRole

Record = tuple[str, bytes, bytes, list[tuple[str, bytes]] | None, int]  # topic, value, key, headers, partition


@dataclass
class PreparedStep:
    """Everything one step's transaction writes, encoded before the transaction begins."""

    what: str
    records: list[Record]
    offsets: list[TopicPartition]
    done: Callable[[], None] = field(default=lambda: None)  # called once the step is committed
    committed: Callable[[], None] = field(default=lambda: None)  # on the commit thread, as soon as it commits


class StepWriter:
    """Writes prepared steps in order, one transaction each, committing each in the background."""

    def __init__(
        self,
        role: TransactionalRole,
        producer: Producer,
        consumer: Consumer,
        ended: Callable[[bool, float], None] = lambda committed, seconds: None,
    ) -> None:
        self.role = role
        self.ended = ended  # told whether each transaction committed, and its seconds from begin
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
            for topic, value, key, headers, partition in step.records:
                produce(self.producer, topic, value, key=key, headers=headers, partition=partition)
            return step.offsets

        began = time.monotonic()
        if not self.role.open_transaction(self.producer, self.consumer, produce_records, step.what):
            self.ended(False, time.monotonic() - began)
            return False
        self._in_flight = (step, self._committer.submit(self._commit, step, began))
        return True

    def _commit(self, step: PreparedStep, began: float) -> bool:
        committed = commit_or_abort(self.producer)
        self.ended(committed, time.monotonic() - began)
        if committed:
            step.committed()
        return committed

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
