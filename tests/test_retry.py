"""The one retry policy: what it retries, until when, and what it says when Kafka does not come back."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from topics.retry import KafkaUnavailableError, RetryPolicy, is_retriable


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
    assert RetryPolicy(deadline_s=5, backoff_s=0.001).call(call, "reading offsets") == "done"
    assert len(calls) == 3


def test_other_errors_propagate_at_once() -> None:
    call, calls = _failing([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    with pytest.raises(KafkaException):
        RetryPolicy(deadline_s=5, backoff_s=0.001).call(call, "reading offsets")
    assert len(calls) == 1
    assert not is_retriable(KafkaError(KafkaError._FENCED, fatal=True))


def test_past_the_deadline_the_error_says_what_and_why() -> None:
    call, calls = _failing([KafkaError.NOT_COORDINATOR] * 1000)
    with pytest.raises(KafkaUnavailableError, match=r"reading offsets: Kafka did not recover within 0.05 s"):
        RetryPolicy(deadline_s=0.05, backoff_s=0.01, max_backoff_s=0.01).call(call, "reading offsets")
    assert 2 <= len(calls) < 1000


def test_extra_codes_can_be_retried() -> None:
    call, _ = _failing([KafkaError.UNKNOWN_TOPIC_OR_PART])
    with pytest.raises(KafkaException):
        RetryPolicy(deadline_s=5, backoff_s=0.001).call(call, "x")
    call, _ = _failing([KafkaError.UNKNOWN_TOPIC_OR_PART])
    assert (
        RetryPolicy(deadline_s=5, backoff_s=0.001, also=frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART})).call(call, "x")
        == "done"
    )
