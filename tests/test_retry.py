"""The one retry policy: what it retries, until when, and what it says when Kafka does not come back."""

from __future__ import annotations

from dataclasses import replace

import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.storage import STORAGE_RETRY, StorageUnavailableError
from connectors.storage.retry import TransientError
from topics.kafka.retry import KAFKA_RETRY, KafkaUnavailableError, is_retriable, kafka_transient
from topics.retry import RetryPolicy


def _policy(**changes: object) -> RetryPolicy:
    return replace(KAFKA_RETRY, **changes)  # type: ignore[arg-type]


def _failing(codes: list[int], result: str = "done"):
    calls = []

    def call() -> str:
        calls.append(1)
        if len(calls) <= len(codes):
            raise KafkaException(KafkaError(codes[len(calls) - 1]))
        return result

    return call, calls


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.NOT_COORDINATOR,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._UNKNOWN_PARTITION,  # the constructor's watermark read, in a chaos run's broker restart
    ],
)
def test_errors_of_a_restarting_broker_are_retried(code: int) -> None:
    # The errors roles died of when the broker restarted: committed offsets, watermark offsets.
    call, calls = _failing([code, code])
    assert _policy(deadline_s=5, backoff_s=0.001).call(call, "reading offsets") == "done"
    assert len(calls) == 3


def test_other_errors_propagate_at_once() -> None:
    call, calls = _failing([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    with pytest.raises(KafkaException):
        _policy(deadline_s=5, backoff_s=0.001).call(call, "reading offsets")
    assert len(calls) == 1
    assert not is_retriable(KafkaError(KafkaError._FENCED, fatal=True))


def test_past_the_deadline_the_error_says_what_and_why() -> None:
    call, calls = _failing([KafkaError.NOT_COORDINATOR] * 1000)
    with pytest.raises(KafkaUnavailableError, match=r"reading offsets: Kafka did not recover within 0.05 s"):
        _policy(deadline_s=0.05, backoff_s=0.01, max_backoff_s=0.01).call(call, "reading offsets")
    assert 2 <= len(calls) < 1000


def test_extra_codes_can_be_retried() -> None:
    call, _ = _failing([KafkaError.UNKNOWN_TOPIC_OR_PART])
    with pytest.raises(KafkaException):
        _policy(deadline_s=5, backoff_s=0.001).call(call, "x")
    call, _ = _failing([KafkaError.UNKNOWN_TOPIC_OR_PART])
    also = kafka_transient(also={KafkaError.UNKNOWN_TOPIC_OR_PART})
    assert _policy(deadline_s=5, backoff_s=0.001, transient=also).call(call, "x") == "done"


@pytest.mark.parametrize("policy", [KAFKA_RETRY, STORAGE_RETRY], ids=["kafka", "storage"])
@pytest.mark.parametrize("failures", [0, 1, 4])
def test_one_policy_retries_what_its_predicate_calls_transient(policy: RetryPolicy, failures: int) -> None:
    # Kafka and storage differ only in what is transient and what is raised past the deadline.
    transient = KafkaException(KafkaError(KafkaError._TRANSPORT)) if policy is KAFKA_RETRY else TransientError("5xx")
    calls: list[int] = []

    def call() -> int:
        calls.append(1)
        if len(calls) <= failures:
            raise transient
        return len(calls)

    fast = replace(policy, backoff_s=0.001, max_backoff_s=0.002)
    assert fast.call(call, "x") == failures + 1
    with pytest.raises(ValueError):
        fast.call(lambda: int("not a number"), "x")

    def always() -> int:
        raise transient

    with pytest.raises((KafkaUnavailableError, StorageUnavailableError), match=r"^reading y: ") as info:
        replace(fast, deadline_s=0.01).call(always, "reading y")
    assert isinstance(info.value.__cause__, type(transient))
