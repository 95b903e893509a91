"""Exactly-once basics against the real broker: what a transaction hides and what it shows."""

from __future__ import annotations

from confluent_kafka import Producer

from tests.kafka_support import committed_values, create_topic, read_to_end


def _transactional_producer(bootstrap: str, transactional_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    producer.init_transactions(30)
    return producer


def test_aborted_records_are_invisible_and_committed_ones_visible_once(kafka_bootstrap: str, unique_name: str) -> None:
    topic = f"{unique_name}.eos"
    create_topic(kafka_bootstrap, topic)
    producer = _transactional_producer(kafka_bootstrap, f"{unique_name}-producer")

    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, key=b"aborted", value=f"aborted-{i}".encode())
    producer.flush(30)
    producer.abort_transaction(30)

    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, key=b"committed", value=f"committed-{i}".encode())
    producer.commit_transaction(30)

    committed = committed_values(kafka_bootstrap, topic, 5)
    everything = [m.value() for m in read_to_end(kafka_bootstrap, topic, isolation="read_uncommitted")]

    assert committed == [f"committed-{i}".encode() for i in range(5)], "the committed records within 30 s"

    # The aborted records were written to the log: only the isolation level hides them.
    assert sorted(everything) == sorted(committed + [f"aborted-{i}".encode() for i in range(5)])


def test_a_new_producer_with_the_same_transactional_id_fences_the_old_one(
    kafka_bootstrap: str, unique_name: str
) -> None:
    topic = f"{unique_name}.fence"
    create_topic(kafka_bootstrap, topic)
    zombie = _transactional_producer(kafka_bootstrap, f"{unique_name}-tid")
    zombie.begin_transaction()
    zombie.produce(topic, value=b"from-zombie")
    zombie.flush(30)

    successor = _transactional_producer(kafka_bootstrap, f"{unique_name}-tid")  # aborts the open txn
    successor.begin_transaction()
    successor.produce(topic, value=b"from-successor")
    successor.commit_transaction(30)

    fenced = False
    try:
        zombie.commit_transaction(30)
    except Exception as exc:  # KafkaException with a fatal or fencing error
        fenced = "fenc" in str(exc).lower() or exc.args[0].fatal()
    assert fenced, "the zombie producer committed after being fenced"
    values = committed_values(kafka_bootstrap, topic, 1)
    assert values == [b"from-successor"], "the successor's committed record within 30 s"
