"""Topic administration in batches (topics/kafka/admin.py ``batch_topics``): a job of 1,195 ranks (1,200 topics) in
batches of 500 against the real broker, and ``batched`` over families of sizes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import given, settings
from hypothesis import strategies as st

from topics.errors import TopicLayoutError
from topics.formats.names import JobTopics
from topics.kafka.admin import batched, delete_job_topics, describe_job_topics, ensure_job_topics, job_layout

SOURCES = ["web", "code"]
RANKS = 1195  # 2 sources x (src, work) + 1,195 rank topics + state, control, dlq, progress = 1,203 topics
BATCH = 500  # three batches: 500, 500, 203
TIMEOUT_S = 60.0  # a batch of 500 topics takes 10-25 s on the 2-core test machine's shared broker


@settings(deadline=None, max_examples=60)
@given(st.lists(st.integers(), max_size=200), st.integers(1, 250))
def test_batched_keeps_order_and_bounds_each_batch(items: list[int], size: int) -> None:
    batches = list(batched(items, size))
    assert [item for batch in batches for item in batch] == items
    assert all(1 <= len(batch) <= size for batch in batches)
    assert all(len(batch) == size for batch in batches[:-1])
    assert len(batches) == -(-len(items) // size)


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_bad_batch_size_is_named(bad: object) -> None:
    with pytest.raises(ValueError, match="batch_topics must be a positive int"):
        ensure_job_topics("127.0.0.1:1", "j", ["web"], 1, batch_topics=bad)  # type: ignore[arg-type]


@pytest.fixture
def job(kafka_bootstrap: str, unique_name: str) -> Iterator[str]:
    """A unique job name whose topics are deleted after the test, whatever its outcome."""
    yield unique_name
    delete_job_topics(kafka_bootstrap, unique_name, timeout_s=TIMEOUT_S, batch_topics=BATCH)


def _delete(bootstrap: str, names: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(names, operation_timeout=TIMEOUT_S).values():
        future.result(timeout=TIMEOUT_S)


def _wait_gone(bootstrap: str, names: list[str]) -> None:
    """Poll the metadata until none of ``names`` shows in it (deleted topics leave it asynchronously), bounded."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + TIMEOUT_S
    while left := sorted(set(names) & set(admin.list_topics(timeout=TIMEOUT_S).topics)):
        if time.monotonic() > deadline:
            pytest.fail(f"{len(left)} topics still in the metadata {TIMEOUT_S:g} s after deletion, e.g. {left[:3]}")
        time.sleep(0.2)


def test_a_thousand_rank_topics_are_created_checked_and_deleted_in_batches(kafka_bootstrap: str, job: str) -> None:
    topics = JobTopics(job)
    names = topics.all(SOURCES, RANKS)
    assert len(names) == 1205
    # One rank topic of the last batch exists already with a foreign config: every batch is still created,
    # and the layout check (itself in batches) names it.
    foreign = topics.rank(RANKS - 2)
    config = {
        **next(spec.config for spec in job_layout(job, SOURCES, RANKS) if spec.name == foreign),
        "retention.ms": "1000",
    }
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(foreign, 1, 1, config=config)])[foreign].result(timeout=TIMEOUT_S)
    with pytest.raises(TopicLayoutError) as error:
        ensure_job_topics(kafka_bootstrap, job, SOURCES, RANKS, timeout_s=TIMEOUT_S, batch_topics=BATCH)
    assert f"topic {foreign}: retention.ms expected -1, actual 1000" in str(error.value)
    assert str(error.value).count("expected") == 1

    # Idempotent: only what is missing is created (topics spread over the three batches), nothing else.
    missing = [foreign, topics.rank(0), topics.rank(499), topics.rank(500), topics.state, topics.src("code")]
    _delete(kafka_bootstrap, [name for name in missing if name != foreign] + [foreign])
    _wait_gone(kafka_bootstrap, missing)
    created = ensure_job_topics(kafka_bootstrap, job, SOURCES, RANKS, timeout_s=TIMEOUT_S, batch_topics=BATCH)
    assert sorted(created) == sorted(missing)
    assert ensure_job_topics(kafka_bootstrap, job, SOURCES, RANKS, timeout_s=TIMEOUT_S, batch_topics=BATCH) == []

    actual = describe_job_topics(kafka_bootstrap, job, timeout_s=TIMEOUT_S, batch_topics=BATCH)
    expected = {spec.name: spec for spec in job_layout(job, SOURCES, RANKS)}
    assert sorted(actual) == sorted(expected)
    for name, spec in expected.items():
        assert actual[name].partitions == spec.partitions, name
        assert actual[name].config == dict(spec.config), name

    deleted = delete_job_topics(kafka_bootstrap, job, timeout_s=TIMEOUT_S, batch_topics=BATCH)
    assert deleted == sorted(names)
    _wait_gone(kafka_bootstrap, names)
    assert delete_job_topics(kafka_bootstrap, job, timeout_s=TIMEOUT_S, batch_topics=BATCH) == []
