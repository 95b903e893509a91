"""The one transactional shape every role shares: stop on a signal after the current piece of work, and
turn each piece of work into one Kafka transaction (begin, produce, send the consumed offsets, commit)
or abort it so that the role redoes it.

A role subclasses ``TransactionalRole``, gives its ``transactional_id``, and hands ``transaction()`` a
function that produces its records and returns the offsets they consumed. Everything about aborting,
fencing and a stuck client lives here; the roles keep only their own work.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from confluent_kafka import KafkaException, Producer, TopicPartition

from topics.kafka.clients import (
    GroupConsumer,
    KafkaClientStuckError,
    KafkaConfig,
    abort,
    commit_or_abort,
    raise_if_fatal,
    raise_if_fenced,
    raise_if_unauthorized,
    send_offsets,
    transactional_producer,
)

log = logging.getLogger(__name__)

OFFSETS_RETRY_DEADLINE_S = 60.0
"""How long adding offsets to a transaction rides out a broker that is away, at least."""


class TransactionalRole:
    """A role that writes exactly once: its records and the offsets of what it consumed commit together.

    ``kind`` and ``work_unit`` name the role and its piece of work in logs ("loader", "unit")."""

    kind = "role"
    work_unit = "piece of work"

    def __init__(self, config: KafkaConfig, transaction_timeout_ms: int) -> None:
        self.config = config
        self.transaction_timeout_ms = transaction_timeout_ms
        self._stopping = False

    @property
    def transactional_id(self) -> str:
        raise NotImplementedError

    @property
    def stopping(self) -> bool:
        return self._stopping

    def request_stop(self, signum: int | None = None, _frame: FrameType | None = None) -> None:
        """Finish the current piece of work, then stop (SIGTERM and SIGINT call this)."""
        if not self._stopping:
            log.info(
                "%s %s: stopping after the current %s (signal %s)",
                self.kind,
                self.transactional_id,
                self.work_unit,
                signum,
            )
        self._stopping = True

    def stop_on_signals(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.request_stop)

    def new_producer(self) -> Producer:
        """The role's transactional producer; initialising it fences any earlier process of the role."""
        return transactional_producer(
            self.config, self.transactional_id, transaction_timeout_ms=self.transaction_timeout_ms
        )

    def transaction(
        self, producer: Producer, consumer: GroupConsumer | None, work: Callable[[], list[TopicPartition]], what: str
    ) -> bool:
        """``open_transaction`` then ``commit_or_abort``: True when committed, False when aborted."""
        return self.open_transaction(producer, consumer, work, what) and commit_or_abort(producer)

    def open_transaction(
        self, producer: Producer, consumer: GroupConsumer | None, work: Callable[[], list[TopicPartition]], what: str
    ) -> bool:
        """Begin a transaction in which ``work()`` produces with ``producer`` and returns the offsets it
        consumed through ``consumer``'s group (None when it consumes nothing), which are added to it. The
        caller commits it with ``commit_or_abort``, maybe on another thread while it prepares the next
        piece of work. True when the transaction is open with everything in it; False when it was aborted
        on an error that allows it (a retriable or abortable Kafka error): the caller rewinds and redoes
        ``what``. Any other error aborts and propagates; a fatal one and a stuck client propagate without
        touching the producer (``ProducerFencedError`` when a newer process of the role fenced this one)."""
        try:
            producer.begin_transaction()
        except KafkaException as exc:
            raise_if_unauthorized(
                exc.args[0], producer, f"{self.kind} {self.transactional_id}: beginning a transaction"
            )
            raise_if_fenced(exc.args[0], self.transactional_id)
            raise_if_fatal(exc.args[0], f"{self.kind} {self.transactional_id}: beginning a transaction")
            raise
        try:
            offsets = work()
            if consumer is not None and offsets:
                # A broker restart can keep the coordinator away for longer than a short transaction
                # timeout; should the broker abort the transaction meanwhile, the next call says so and
                # the work is redone below.
                deadline_s = max(OFFSETS_RETRY_DEADLINE_S, self.transaction_timeout_ms / 1000)
                send_offsets(producer, consumer, offsets, timeout_s=deadline_s)
        except KafkaClientStuckError:
            raise
        except KafkaException as exc:
            error = exc.args[0]
            raise_if_unauthorized(error, producer, f"{self.kind} {self.transactional_id}: {what}")
            raise_if_fenced(error, self.transactional_id)
            raise_if_fatal(error, f"{self.kind} {self.transactional_id}: {what}")
            if not (error.txn_requires_abort() or error.retriable()):
                abort_after(producer, exc)
                raise
            log.warning("%s %s: aborting %s: %s", self.kind, self.transactional_id, what, exc)
            abort(producer)
            return False
        except BaseException as exc:
            abort_after(producer, exc)
            raise
        return True


def abort_after(producer: Producer, cause: BaseException) -> None:
    """Abort the open transaction because of ``cause``, which the caller raises next. Should the abort fail too
    (the broker may have ended the transaction at its timeout while ``cause`` was being handled), that is
    logged and ``cause`` stays the error reported: nothing of the transaction commits either way, as the broker
    aborts a transaction that is never ended."""
    try:
        abort(producer)
    except Exception as exc:
        log.warning("aborting the transaction after %s failed as well: %s", type(cause).__name__, exc)


@contextmanager
def closing_unless_stuck(*close: Callable[[], object]) -> Iterator[None]:
    """Run the ``close`` calls when the block ends, unless it ends with a stuck Kafka client: closing
    that would hang as well, and the process must exit for a new one to fence it."""
    try:
        yield
    except KafkaClientStuckError:
        raise
    except BaseException:
        for call in close:
            try:
                call()
            except Exception:  # the error the block raised is the one to report
                log.exception("closing a Kafka client after an error failed as well")
        raise
    for call in close:
        call()
