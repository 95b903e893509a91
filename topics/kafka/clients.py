"""Kafka clients configured for mixflow's roles, and the commit-or-abort rule for transactions."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from topics.errors import MixflowError
from topics.kafka.authorization import AUTHORIZATION_FAILED, is_authorization_error, refused, topics_without
from topics.kafka.librdkafka_log import logged
from topics.kafka.renewing_consumer import RenewingConsumer
from topics.kafka.retry import KAFKA_RETRY, KafkaUnavailableError

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

KafkaConfig = Mapping[str, Any]
T = TypeVar("T")


TRANSACTIONAL_PRODUCER_SETTINGS: dict[str, Any] = {
    # Batch many small samples per request; 5 ms of latency is nothing next to a training step.
    "linger.ms": 5,
    "batch.size": 1_048_576,
    # Token ids compress well and cheaply. What the broker stores changes with it, not what readers
    # get; "none" trades broker disk and network for CPU (benchmarks/README.md, constructor throughput).
    "compression.type": "lz4",
    # Room for a whole work unit or step in flight before produce() has to wait.
    "queue.buffering.max.kbytes": 524_288,
    "queue.buffering.max.messages": 1_000_000,
    # Batches of one step can be several MB (the broker allows 64 MB).
    "message.max.bytes": 67_108_864,
}
"""Defaults of every transactional producer; a role's base config (the spec's ``kafka.config``) wins."""

# A consumer whose group metadata a transaction commits its offsets under.
GroupConsumer = Consumer | RenewingConsumer


class TransactionalProducer(Producer):
    """A transactional ``Producer`` that keeps its client settings (``base``), its ``transactional_id`` and the
    topics its open transaction wrote through ``produce`` (this module's), so that a refusal can name the
    principal and the resource."""

    def __init__(self, config: KafkaConfig, base: KafkaConfig, transactional_id: str) -> None:
        super().__init__(dict(config))
        self.base = base
        self.transactional_id = transactional_id
        self.written: set[str] = set()

    def begin_transaction(self, *args: Any) -> None:
        self.written.clear()
        super().begin_transaction(*args)


def raise_if_unauthorized(error: KafkaError, producer: Producer, what: str) -> None:
    """``AuthorizationError`` naming the principal, the resource and the operation when the cluster refused
    ``producer``'s transaction (its open transaction aborted first, where it can be: nothing is written)."""
    if not is_authorization_error(error):
        return
    if not isinstance(producer, TransactionalProducer):
        raise refused({}, "an operation", AUTHORIZATION_FAILED[error.code()], "(unknown)", what)
    if not error.fatal():
        with contextlib.suppress(KafkaException, MixflowError):
            producer.abort_transaction(10)
    kind, base = AUTHORIZATION_FAILED[error.code()], producer.base
    if kind == "topic":
        lacking = topics_without(base, producer.written, "WRITE") or sorted(producer.written)
        raise refused(base, "WRITE", "topic", ", ".join(lacking) or "(one this transaction wrote)", what)
    if kind == "group":
        raise refused(base, "READ", "group", "of the consumed offsets", what)
    if kind == "cluster":
        raise refused(base, "IDEMPOTENT_WRITE", "cluster", "kafka-cluster", what)
    raise refused(base, "WRITE", kind, producer.transactional_id, what)


def transactional_producer(
    base: KafkaConfig,
    transactional_id: str,
    *,
    transaction_timeout_ms: int = 60_000,
    init_timeout_s: float = 60.0,
) -> TransactionalProducer:
    """A producer for exactly-once writes, with its transactions initialised.

    Initialising fences any earlier producer with the same ``transactional_id`` and aborts its open
    transaction, which is how a restarted role takes over from its dead predecessor at once."""
    config = {
        **TRANSACTIONAL_PRODUCER_SETTINGS,
        **base,  # the spec's kafka.config may override the settings above (e.g. compression.type: none)
        "transactional.id": transactional_id,
        # An open transaction of a killed producer blocks read_committed readers until this passes.
        "transaction.timeout.ms": transaction_timeout_ms,
    }
    producer = TransactionalProducer(config, base, transactional_id)
    try:
        producer.init_transactions(init_timeout_s)
    except KafkaException as exc:
        # Refused before the coordinator is asked for a producer id: the id's owner is not fenced.
        raise_if_unauthorized(exc.args[0], producer, "initialising transactions")
        where = base.get("bootstrap.servers")
        msg = f"cannot initialise transactions for {transactional_id!r} at {where}: {exc}"
        raise MixflowError(msg) from exc
    return producer


def read_committed_consumer(base: KafkaConfig, group_id: str, **overrides: Any) -> Consumer:
    return Consumer(read_committed_settings(base, group_id, **overrides))


def read_committed_settings(base: KafkaConfig, group_id: str, **overrides: Any) -> dict[str, Any]:
    return {
        **logged(base),  # librdkafka's lines less its known-benign ones (topics/kafka/librdkafka_log.py)
        "group.id": group_id,
        # Offsets are committed inside the producer's transactions, never on their own.
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        # Records of aborted or open transactions are never seen.
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        **overrides,
    }


def produce(producer: Producer, topic: str, value: bytes | pa.Buffer, **kwargs: Any) -> None:
    """``producer.produce`` that waits for room when the local queue is full instead of failing."""
    if type(producer) is TransactionalProducer:
        producer.written.add(topic)
    while True:
        try:
            producer.produce(topic, value, **kwargs)
            return
        except BufferError:
            producer.poll(0.1)


def retry_retriable(call: Callable[[], T], what: str, timeout_s: float = 60.0) -> T:
    """``call()`` under the roles' retry policy (``topics.kafka.retry``), with a deadline of ``timeout_s``."""
    return replace(KAFKA_RETRY, deadline_s=timeout_s).call(call, what)


class ProducerFencedError(MixflowError):
    """Another process initialised the same ``transactional.id``: this one must not write again."""


_FENCED = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})


def raise_if_fenced(error: KafkaError, transactional_id: str) -> None:
    if error.fatal() and error.code() in _FENCED:
        msg = f"{transactional_id}: fenced by a newer process with the same transactional.id ({error.str()})"
        raise ProducerFencedError(msg)


class KafkaClientStuckError(MixflowError):
    """A client call that does not return. The role must exit so that its supervisor starts a new
    process; the new one fences this one's transactional.id and nothing is lost or repeated."""


class ProducerUnusableError(KafkaClientStuckError):
    """The producer hit a fatal error (the broker aborted its transaction after the transaction timeout
    while it was away, say) and cannot write again. As for a stuck client, the role exits (code 3) so
    that a new process, with a new producer, takes over from the committed offsets."""


def raise_if_fatal(error: KafkaError, what: str) -> None:
    if error.fatal():
        msg = f"{what}: the producer hit a fatal error ({error.str()}); exiting so that a new process takes over"
        raise ProducerUnusableError(msg)


SEND_OFFSETS_CALL_S = 15.0
"""librdkafka's timeout for one attempt at adding offsets to a transaction."""
STUCK_MARGIN_S = 10.0
"""How long past its own timeout one attempt may take before the client counts as stuck."""


def send_offsets(
    producer: Producer, consumer: GroupConsumer, offsets: list[TopicPartition], timeout_s: float = 60.0
) -> None:
    """Add consumed offsets to the open transaction, riding out a broker that is briefly away.

    librdkafka can block in this call forever once the group coordinator went away, whatever its
    timeout (confluentinc/librdkafka#5456, #5511): the attempts run on a watchdog thread, and when one
    has not returned ``STUCK_MARGIN_S`` after its own timeout, KafkaClientStuckError ends the role
    instead of letting it hang (so losing the broker that coordinates the role's group costs about 25 s
    and a restart, not the whole retry deadline)."""
    metadata = consumer.consumer_group_metadata()
    per_call = min(timeout_s, SEND_OFFSETS_CALL_S)
    outcome: list[BaseException | None] = []
    attempt_started = [time.monotonic()]

    def attempt() -> None:
        attempt_started[0] = time.monotonic()
        try:
            producer.send_offsets_to_transaction(offsets, metadata, per_call)
        finally:
            attempt_started[0] = time.monotonic()  # a backoff before the next attempt is not a hang

    def call() -> None:
        try:
            retry_retriable(attempt, "adding offsets to a transaction", timeout_s)
            outcome.append(None)
        except KafkaUnavailableError as exc:
            # Seen after a broker restart: every attempt times out on a coordinator connection that
            # never sends its request again (librdkafka#5511), so a new process is the way out.
            outcome.append(KafkaClientStuckError(f"{exc}; exiting so that a new process takes over"))
        except BaseException as exc:  # handed to the caller's thread
            outcome.append(exc)

    worker = threading.Thread(target=call, name="send-offsets", daemon=True)
    worker.start()
    while not outcome:
        worker.join(1.0)
        if not outcome and time.monotonic() - attempt_started[0] > per_call + STUCK_MARGIN_S:
            msg = (
                f"adding offsets to the transaction did not return in {per_call + STUCK_MARGIN_S:.0f} s (the Kafka "
                "client is stuck, see confluentinc/librdkafka#5456); exiting so that a new process takes over"
            )
            raise KafkaClientStuckError(msg)
    if outcome[0] is not None:
        raise outcome[0]


def close_within(close: Callable[[], object], timeout_s: float, what: str) -> None:
    """``close()`` on a watchdog thread: a client in a bad state can hang in it, and then
    KafkaClientStuckError ends the role so that a new process takes over."""
    outcome: list[BaseException | None] = []

    def call() -> None:
        try:
            close()
            outcome.append(None)
        except BaseException as exc:  # handed to the caller's thread
            outcome.append(exc)

    worker = threading.Thread(target=call, name="close-client", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not outcome:
        msg = f"{what} did not return in {timeout_s:.0f} s (the Kafka client is stuck); exiting for a new process"
        raise KafkaClientStuckError(msg)
    if outcome[0] is not None:
        raise outcome[0]


def commit_or_abort(producer: Producer, timeout_s: float = 60.0) -> bool:
    """Commit the open transaction. True when committed; False when it had to be aborted (the caller
    redoes its work); raises MixflowError on a fatal error (the producer is fenced or broken and the
    process must start a new one)."""
    try:
        retry_retriable(lambda: producer.commit_transaction(timeout_s), "committing the transaction", timeout_s)
        return True
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        raise_if_unauthorized(error, producer, "committing a transaction")
        if error.txn_requires_abort():
            log.warning("transaction aborted: %s", error)
            abort(producer, timeout_s)
            return False
        raise_if_fenced(error, "this producer")
        raise_if_fatal(error, "committing the transaction")
        msg = f"transaction cannot commit: {error}"
        raise MixflowError(msg) from exc


def abort(producer: Producer, timeout_s: float = 60.0) -> None:
    try:
        retry_retriable(lambda: producer.abort_transaction(timeout_s), "aborting the transaction", timeout_s)
    except KafkaException as exc:
        raise_if_fenced(exc.args[0], "this producer")
        raise_if_fatal(exc.args[0], "aborting the transaction")
        msg = f"transaction cannot abort: {exc.args[0]}"
        raise MixflowError(msg) from exc
