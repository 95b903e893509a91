"""The consumer that replaces a librdkafka client whose fetching stalled, and the end-offset client that
replaces itself after a failed question, against the real broker.

librdkafka's own stall (a leader it keeps as unknown after a broker restart) cannot be called up on
demand; a client paused behind the wrapper's back stops fetching in the same silent way."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from tests.fake_clock import FakeClock
from tests.kafka_support import create_topic
from topics.kafka.offset_lookup import OffsetLookup
from topics.kafka.renewing_consumer import RenewingConsumer

STALL_S = 5.0
TIMEOUT_S = 60.0


def transactional_records(bootstrap: str, topic: str, partitions: int, per_partition: int, *, abort: bool = False):
    """``per_partition`` records on each partition, a transaction of a few at a time (each ends in a marker)."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"t-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    for start in range(0, per_partition, 3):
        producer.begin_transaction()
        for i in range(start, min(start + 3, per_partition)):
            for p in range(partitions):
                producer.produce(topic, f"{p}:{i}".encode(), partition=p)
        if abort:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)


def settings(bootstrap: str, **extra: object) -> dict[str, object]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": f"renew-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "fetch.wait.max.ms": 20,
        **extra,
    }


def read(consumer: RenewingConsumer, clock: FakeClock, wanted: int, step_s: float, got: list[bytes]) -> None:
    """Consume until ``wanted`` records are in ``got``, ``step_s`` of the wrapper's time per call."""
    deadline = time.monotonic() + TIMEOUT_S
    while len(got) < wanted:
        assert time.monotonic() < deadline, f"read {len(got)} of {wanted} records; renewals {consumer.renewals}"
        for message in consumer.consume(100, timeout=0.2):
            assert message.error() is None, message.error()
            got.append(message.value())
        clock.now += step_s


def idle(consumer: RenewingConsumer, clock: FakeClock, calls: int, step_s: float) -> list[object]:
    out = []
    for _ in range(calls):
        out += consumer.consume(100, timeout=0.05)
        clock.now += step_s
    return out


@contextlib.contextmanager
def reading_from_the_start(bootstrap: str, topic: str, partitions: int) -> Iterator[tuple[RenewingConsumer, FakeClock]]:
    clock = FakeClock()
    consumer = RenewingConsumer(settings(bootstrap), stall_after_s=STALL_S, clock=clock)
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        yield consumer, clock
    finally:
        consumer.close()


def expected(partitions: int, start: int, stop: int) -> list[bytes]:
    return [f"{p}:{i}".encode() for p in range(partitions) for i in range(start, stop)]


def test_a_client_that_stops_fetching_is_replaced_and_reading_goes_on_where_it_stood(
    kafka_bootstrap: str, unique_name: str
) -> None:
    create_topic(kafka_bootstrap, unique_name, partitions=2)
    transactional_records(kafka_bootstrap, unique_name, 2, 10)
    with reading_from_the_start(kafka_bootstrap, unique_name, 2) as (consumer, clock):
        got: list[bytes] = []
        read(consumer, clock, 20, 0.5, got)
        # The client stops fetching one partition and says nothing, as librdkafka#5430 leaves it.
        consumer._client.pause([TopicPartition(unique_name, 1)])
        transactional_records(kafka_bootstrap, unique_name, 2, 10)
        read(consumer, clock, 40, 0.5, got)
        assert consumer.renewals == 1
    assert sorted(got) == sorted(expected(2, 0, 10) * 2), "a record was skipped or read twice"
    for p in range(2):
        in_order = [f"{p}:{i}".encode() for i in range(10)] * 2
        assert [v for v in got if v.startswith(f"{p}:".encode())] == in_order


def test_a_client_at_the_end_is_kept_however_long_it_waits_past_markers_and_aborted_transactions(
    kafka_bootstrap: str, unique_name: str
) -> None:
    create_topic(kafka_bootstrap, unique_name, partitions=2)
    transactional_records(kafka_bootstrap, unique_name, 2, 7)
    transactional_records(kafka_bootstrap, unique_name, 2, 4, abort=True)  # the log ends in aborted ones
    with reading_from_the_start(kafka_bootstrap, unique_name, 2) as (consumer, clock):
        read(consumer, clock, 14, 0.5, [])
        assert idle(consumer, clock, 60, 1.0) == []  # 60 s of its time waiting at the end
        assert consumer.renewals == 0


def test_a_paused_partition_or_a_caller_busy_elsewhere_is_no_stall(kafka_bootstrap: str, unique_name: str) -> None:
    create_topic(kafka_bootstrap, unique_name)
    partition = TopicPartition(unique_name, 0)
    with reading_from_the_start(kafka_bootstrap, unique_name, 1) as (consumer, clock):
        consumer.pause([partition])
        transactional_records(kafka_bootstrap, unique_name, 1, 5)
        assert idle(consumer, clock, 30, 1.0) == []
        consumer.resume([partition])
        got: list[bytes] = []
        read(consumer, clock, 5, 0.5, got)
        transactional_records(kafka_bootstrap, unique_name, 1, 5)
        clock.now += 10 * STALL_S  # the caller did other work: records waiting now were not waited for
        read(consumer, clock, 10, 0.5, got)
        assert consumer.renewals == 0
    assert got == expected(1, 0, 5) * 2


def test_end_of_partition_events_reach_only_a_caller_that_asked(kafka_bootstrap: str, unique_name: str) -> None:
    create_topic(kafka_bootstrap, unique_name)
    transactional_records(kafka_bootstrap, unique_name, 1, 3)
    for asked, events in ((False, 0), (True, 1)):
        clock = FakeClock()
        consumer = RenewingConsumer(
            settings(kafka_bootstrap, **({"enable.partition.eof": True} if asked else {})), clock=clock
        )
        try:
            consumer.assign([TopicPartition(unique_name, 0, 0)])
            seen: list = []
            deadline = time.monotonic() + TIMEOUT_S
            while len([m for m in seen if m.error() is None]) < 3:
                assert time.monotonic() < deadline
                seen += consumer.consume(100, timeout=0.2)
            seen += idle(consumer, clock, 10, 0.1)
            eofs = [m for m in seen if m.error() is not None and m.error().code() == KafkaError._PARTITION_EOF]
            assert len(eofs) == events
        finally:
            consumer.close()


def test_an_end_offset_client_that_failed_is_replaced_by_one_that_answers(
    kafka_bootstrap: str, unique_name: str
) -> None:
    create_topic(kafka_bootstrap, unique_name)
    transactional_records(kafka_bootstrap, unique_name, 1, 3)
    ends = OffsetLookup({"bootstrap.servers": kafka_bootstrap})
    try:
        with pytest.raises(KafkaException):
            ends.end(TopicPartition(unique_name, 7), timeout_s=2)  # no such partition, asked until the timeout
        assert ends.replaced >= 2
        assert ends.end(TopicPartition(unique_name, 0), timeout_s=10) == 4  # 3 records and the marker
        assert ends.partitions(unique_name, timeout_s=10) == [0]
        assert ends.partitions(f"{unique_name}-none", timeout_s=10) == []
    finally:
        ends.close()
