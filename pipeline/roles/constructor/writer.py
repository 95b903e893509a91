"""The constructor's writing of steps, pipelined: the whole transaction of step k (begin, produce every
rank batch and the state record, send the offsets, commit) runs on a thread while the main thread reads,
plans and encodes step k+1. Transactions still follow one another (step k+1's begins only once step k's
has committed), so what is written and its exactly-once guarantee are those of one step at a time; only
the transaction's time overlaps the next step's work. Whatever the transaction raises (``ProducerFencedError``,
``KafkaClientStuckError``, ...) is raised again on the main thread when it next hands over a step or
waits.

With ``steps_per_transaction`` k > 1, k consecutive steps share one transaction (group commit): their
records in step order, the last step's offsets. A commit writes a marker to every partition the
transaction touched, one per rank topic, which at a thousand ranks costs more than the steps' data;
grouping divides that by k. Every step keeps its own state record, so a restart resumes after the last
step of the last committed group, and an aborted group is redone from there like an aborted step. A
partial group is written as soon as the main thread waits for data (``flush``), so grouping adds no
latency when the constructor keeps up with its sources."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from confluent_kafka import Producer, TopicPartition

from pipeline.kafka.role_protocol import TransactionalRole
from topics.kafka.clients import GroupConsumer, commit_or_abort, produce

if TYPE_CHECKING:
    import pyarrow as pa


class Record(NamedTuple):
    """One record of a step's transaction: where it goes and what it holds."""

    topic: str
    value: bytes | pa.Buffer  # a batch's Arrow stream as it was written (the producer copies it)
    key: bytes
    headers: list[tuple[str, bytes]] | None
    partition: int


@dataclass
class PreparedStep:
    """Everything one step's transaction writes, encoded before the transaction begins."""

    what: str
    records: list[Record]
    offsets: list[TopicPartition]
    done: Callable[[], None] = field(default=lambda: None)  # on the main thread, once the step is committed
    committed: Callable[[], None] = field(default=lambda: None)  # on the writer thread, as soon as it commits


class StepWriter:
    """Writes prepared steps in order, ``steps_per_transaction`` to a transaction, on a thread of its own."""

    def __init__(
        self,
        role: TransactionalRole,
        producer: Producer,
        consumer: GroupConsumer,
        ended: Callable[[bool, float], None] = lambda committed, seconds: None,
        steps_per_transaction: int = 1,
    ) -> None:
        if steps_per_transaction < 1:
            msg = f"steps_per_transaction must be >= 1, got {steps_per_transaction}"
            raise ValueError(msg)
        self.role = role
        self.ended = ended  # told whether each transaction committed, and its seconds from begin
        self.producer = producer
        self.consumer = consumer
        self.steps_per_transaction = steps_per_transaction
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="step-transaction")
        self._pending: list[PreparedStep] = []  # handed over, not yet in a transaction
        self._in_flight: tuple[list[PreparedStep], Future[bool]] | None = None

    def write(self, step: PreparedStep) -> bool:
        """Hand over ``step``; once ``steps_per_transaction`` are handed over, wait for the transaction
        before to commit and start theirs on the writer thread. False when the transaction before was
        aborted: nothing handed over since is written, and the caller resumes from the last committed
        state."""
        self._pending.append(step)
        if len(self._pending) < self.steps_per_transaction:
            return True
        return self._submit()

    def flush(self) -> bool:
        """Start the transaction of the steps handed over so far if the writer thread is free, without
        waiting (the main thread calls this while it waits for data). False as for ``write``."""
        if not self._pending or (self._in_flight is not None and not self._in_flight[1].done()):
            return True
        return self._submit()

    def _submit(self) -> bool:
        settled = self._wait_in_flight()
        if settled is None:
            self._pending.clear()
            return False
        steps, self._pending = self._pending, []
        self._in_flight = (steps, self._thread.submit(self._transaction, steps))
        # The settled steps' bookkeeping runs while the next transaction is already under way, not before it.
        for step in settled:
            step.done()
        return True

    def _transaction(self, steps: list[PreparedStep]) -> bool:
        def produce_records() -> list[TopicPartition]:
            for step in steps:
                # The producer copies each value: ours are let go as they are produced (an aborted step is
                # prepared again from the last committed state, never produced again from these).
                records, step.records = step.records, []
                records.reverse()
                while records:
                    topic, value, key, headers, partition = records.pop()
                    produce(self.producer, topic, value, key=key, headers=headers, partition=partition)
            return steps[-1].offsets  # cumulative positions: the last step's cover every step before it

        what = steps[0].what if len(steps) == 1 else f"{steps[0].what} to {steps[-1].what}"
        began = time.monotonic()
        committed = self.role.open_transaction(self.producer, self.consumer, produce_records, what) and commit_or_abort(
            self.producer
        )
        self.ended(committed, time.monotonic() - began)
        if committed:
            for step in steps:
                step.committed()
        return committed

    @property
    def in_flight(self) -> int:
        """Steps handed over and not yet settled: waiting for their transaction, or in one."""
        return len(self._pending) + (len(self._in_flight[0]) if self._in_flight is not None else 0)

    def poll(self) -> bool:
        """Settle the transaction in flight if it has ended, without waiting: False when it was aborted
        (the caller resumes from the last committed state), True otherwise."""
        if self._in_flight is None or not self._in_flight[1].done():
            return True
        if not self._settle():
            self._pending.clear()
            return False
        return True

    def wait(self) -> bool:
        """Write every step handed over and wait for it; True when all committed (or there were none).
        Raises what a transaction raised."""
        if self._pending and not self._submit():
            return False
        return self._settle()

    def _settle(self) -> bool:
        """Wait for the transaction in flight, if any; True when it committed (or none was in flight)."""
        settled = self._wait_in_flight()
        if settled is None:
            return False
        for step in settled:
            step.done()
        return True

    def _wait_in_flight(self) -> list[PreparedStep] | None:
        """Wait for the transaction in flight, if any: its steps when it committed (none when none was in
        flight), None when it was aborted. Their ``done`` is the caller's to call."""
        if self._in_flight is None:
            return []
        steps, transaction = self._in_flight
        self._in_flight = None
        try:
            committed = transaction.result()
        except BaseException:
            # Fenced, or the client failed: nothing handed over since is written, and a later wait()
            # (the caller's cleanup) must not start a transaction on that producer.
            self._pending.clear()
            raise
        return steps if committed else None

    def close(self) -> None:
        self._thread.shutdown(wait=True)
