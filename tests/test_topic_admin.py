"""Topic administration against the real broker (and a closed port for the unreachable case)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from topics.errors import MixflowError, TopicLayoutError
from topics.formats.names import JobTopics
from topics.kafka.admin import (
    LARGE_MESSAGE_BYTES,
    client_config,
    delete_job_topics,
    describe_job_topics,
    ensure_job_topics,
    job_layout,
    topic_exists,
)

TIMEOUT_S = 20.0


@pytest.fixture
def job(kafka_bootstrap: str, unique_name: str) -> Iterator[str]:
    """A unique job name whose topics are deleted after the test."""
    yield unique_name
    delete_job_topics(kafka_bootstrap, unique_name, timeout_s=TIMEOUT_S)


def test_layout_without_a_broker() -> None:
    layout = {spec.name: spec for spec in job_layout("j", ["web"], 2, work_partitions=3)}
    assert {name: spec.partitions for name, spec in layout.items()} == {
        "j.src.web": 1,
        "j.work.web": 3,
        "j.plan.web": 1,
        "j.rank.0": 1,
        "j.rank.1": 1,
        "j.state": 1,
        "j.control": 1,
        "j.dlq": 1,
        "j.progress": 1,
    }
    for spec in layout.values():
        assert spec.config["retention.ms"] == spec.config["retention.bytes"] == "-1"
        # Only each rank's latest progress report matters; everything else is kept whole, in order.
        assert spec.config["cleanup.policy"] == ("compact" if spec.name == "j.progress" else "delete")
    assert layout["j.rank.1"].config["max.message.bytes"] == str(LARGE_MESSAGE_BYTES)
    assert layout["j.src.web"].config["max.message.bytes"] == str(LARGE_MESSAGE_BYTES)
    assert "max.message.bytes" not in layout["j.work.web"].config
    with pytest.raises(ValueError, match="work_partitions"):
        job_layout("j", ["web"], 1, work_partitions=0)


def test_client_config() -> None:
    assert client_config("h:9092") == {"bootstrap.servers": "h:9092"}
    sasl = {"bootstrap.servers": "h:9093", "security.protocol": "SASL_SSL"}
    assert client_config(sasl, {"client.id": "x"}) == {**sasl, "client.id": "x"}
    with pytest.raises(ValueError, match="no Kafka bootstrap servers"):
        client_config({"security.protocol": "SSL"})
    with pytest.raises(ValueError, match="bootstrap string or a dict"):
        client_config(9092)  # type: ignore[arg-type]


def test_create_twice_is_idempotent(kafka_bootstrap: str, job: str) -> None:
    names = JobTopics(job).all(["web", "code"], 2)
    created = ensure_job_topics(kafka_bootstrap, job, ["web", "code"], 2, work_partitions=3, timeout_s=TIMEOUT_S)
    assert sorted(created) == sorted(names)
    again = ensure_job_topics(kafka_bootstrap, job, ["web", "code"], 2, work_partitions=3, timeout_s=TIMEOUT_S)
    assert again == []
    actual = describe_job_topics(kafka_bootstrap, job, timeout_s=TIMEOUT_S)
    assert sorted(actual) == sorted(names)
    assert actual[JobTopics(job).work("web")].partitions == 3
    assert actual[JobTopics(job).src("web")].partitions == 1
    assert actual[JobTopics(job).rank(1)].config["max.message.bytes"] == str(LARGE_MESSAGE_BYTES)
    assert actual[JobTopics(job).state].config["retention.ms"] == "-1"
    assert topic_exists(kafka_bootstrap, JobTopics(job).dlq, timeout_s=TIMEOUT_S)


def test_concurrent_creators_both_succeed(kafka_bootstrap: str, job: str) -> None:
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def ensure() -> None:
        try:
            results.append(ensure_job_topics(kafka_bootstrap, job, ["web"], 4, timeout_s=TIMEOUT_S))
        except BaseException as exc:  # handed to the test thread below
            errors.append(exc)

    threads = [threading.Thread(target=ensure) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S + 10)
    assert not errors, errors
    assert len(results) == 2
    created = results[0] + results[1]
    assert sorted(created) == sorted(set(created)) == sorted(JobTopics(job).all(["web"], 4))


def test_partition_mismatch_names_topic_key_expected_and_actual(kafka_bootstrap: str, job: str) -> None:
    ensure_job_topics(kafka_bootstrap, job, ["web"], 1, work_partitions=2, timeout_s=TIMEOUT_S)
    with pytest.raises(TopicLayoutError) as error:
        ensure_job_topics(kafka_bootstrap, job, ["web"], 1, work_partitions=3, timeout_s=TIMEOUT_S)
    assert f"topic {job}.work.web: partitions expected 3, actual 2" in str(error.value)
    assert f"{job}.src.web" not in str(error.value)


def test_config_mismatch_names_topic_key_expected_and_actual(kafka_bootstrap: str, job: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    state = JobTopics(job).state
    # A foreign state topic that expires records after one second.
    futures = admin.create_topics([NewTopic(state, 1, 1, config={"retention.ms": "1000"})])
    futures[state].result(timeout=TIMEOUT_S)
    with pytest.raises(TopicLayoutError) as error:
        ensure_job_topics(kafka_bootstrap, job, ["web"], 1, timeout_s=TIMEOUT_S)
    assert f"topic {state}: retention.ms expected -1, actual 1000" in str(error.value)


def test_delete_touches_only_the_job(kafka_bootstrap: str, job: str) -> None:
    other = f"{job}-b"  # shares the job's name as a prefix, but not its topic prefix "<job>."
    try:
        ensure_job_topics(kafka_bootstrap, job, ["web"], 1, timeout_s=TIMEOUT_S)
        ensure_job_topics(kafka_bootstrap, other, ["web"], 1, timeout_s=TIMEOUT_S)
        deleted = delete_job_topics(kafka_bootstrap, job, timeout_s=TIMEOUT_S)
        assert sorted(deleted) == sorted(JobTopics(job).all(["web"], 1))
        assert sorted(describe_job_topics(kafka_bootstrap, other)) == sorted(JobTopics(other).all(["web"], 1))
    finally:
        delete_job_topics(kafka_bootstrap, other, timeout_s=TIMEOUT_S)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The call must give up by itself when its timeout passes: a hang fails here, at pytest-timeout's limit,
# instead of blocking the suite for the default 300 s.
@pytest.mark.timeout(60)
@pytest.mark.parametrize("call", [ensure_job_topics, delete_job_topics])
def test_unreachable_broker_raises_naming_servers_and_timeout(call) -> None:
    port = _closed_port()
    arguments = ("job", ["web"], 1) if call is ensure_job_topics else ("job",)
    with pytest.raises(MixflowError) as error:
        call(f"127.0.0.1:{port}", *arguments, timeout_s=1.5)
    assert f"on Kafka at 127.0.0.1:{port}: " in str(error.value)
    assert "no answer within 1.5 s" in str(error.value)
