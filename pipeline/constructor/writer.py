"""The constructor's writing of steps, pipelined: the whole transaction of step k (begin, produce every
rank batch and the state record, send the offsets, commit) runs on a thread while the main thread reads,
plans and encodes step k+1. Transactions still follow one another (step k+1's begins only once step k's
has committed), so what is written and its exactly-once guarantee are unchanged; only the transaction's
time overlaps the next step's work. Whatever the transaction raises (``ProducerFencedError``,
``KafkaClientStuckError``, ...) is raised again on the main thread when it next hands over a step or
waits."""

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
    done: Callable[[], None] = field(default=lambda: None)  # on the main thread, once the step is committed
    committed: Callable[[], None] = field(default=lambda: None)  # on the writer thread, as soon as it commits


class StepWriter:
    """Writes prepared steps in order, one transaction each, on a thread of its own."""

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
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="step-transaction")
        self._in_flight: tuple[PreparedStep, Future[bool]] | None = None

    def write(self, step: PreparedStep) -> bool:
        """Wait for the step before to commit, then start ``step``'s transaction on the writer thread.
        False when the step before was aborted: ``step`` is not written, and the caller resumes from the
        last committed state."""
        if not self.wait():
            return False
        self._in_flight = (step, self._thread.submit(self._transaction, step))
        return True

    def _transaction(self, step: PreparedStep) -> bool:
        def produce_records() -> list[TopicPartition]:
            for topic, value, key, headers, partition in step.records:
                produce(self.producer, topic, value, key=key, headers=headers, partition=partition)
            return step.offsets

        began = time.monotonic()
        committed = self.role.open_transaction(
            self.producer, self.consumer, produce_records, step.what
        ) and commit_or_abort(self.producer)
        self.ended(committed, time.monotonic() - began)
        if committed:
            step.committed()
        return committed

    @property
    def in_flight(self) -> int:
        """1 while a step's transaction is under way (or ended and not yet waited for), else 0."""
        return int(self._in_flight is not None)

    def poll(self) -> bool:
        """Settle the step in flight if its transaction has ended, without waiting: False when it was
        aborted (the caller resumes from the last committed state), True otherwise."""
        if self._in_flight is None or not self._in_flight[1].done():
            return True
        return self.wait()

    def wait(self) -> bool:
        """Wait for the step in flight, if any; True when it committed (or none was in flight). Raises
        what its transaction raised."""
        if self._in_flight is None:
            return True
        step, transaction = self._in_flight
        self._in_flight = None
        if not transaction.result():
            return False
        step.done()
        return True

    def close(self) -> None:
        self._thread.shutdown(wait=True)
