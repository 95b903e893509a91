"""`mixflow topics list` and `mixflow topics delete`: a finished job's topics and groups go, another job's and
a running job's stay."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from pipeline.cli import main
from topics.formats.names import JobTopics
from topics.kafka.admin import ensure_job_topics, job_groups, list_jobs

TIMEOUT_S = 60.0


def _group_member(bootstrap: str, group: str, topic: str) -> Consumer:
    """A consumer that has joined ``group`` (subscribed to ``topic``) and holds an assignment."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": 10_000})
    consumer.subscribe([topic])
    deadline = time.monotonic() + TIMEOUT_S
    while not consumer.assignment():
        assert time.monotonic() < deadline, f"no assignment in {group} within {TIMEOUT_S} s"
        consumer.poll(0.2)
    return consumer


def _committed_group(bootstrap: str, group: str, topic: str) -> None:
    """An empty group with a committed offset, as a stopped loader leaves its group."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    consumer.close()


@pytest.mark.kafka
def test_delete_removes_one_finished_job_and_only_it(
    kafka_bootstrap: str, unique_name: str, capsys: pytest.CaptureFixture
) -> None:
    finished, other = f"{unique_name[:40]}a", f"{unique_name[:40]}b"
    for job in (finished, other):
        ensure_job_topics(kafka_bootstrap, job, ["web"], 2)
        _committed_group(kafka_bootstrap, f"{job}.loaders.web", JobTopics(job).work("web"))
    cluster = ["--bootstrap-servers", kafka_bootstrap]

    assert main(["topics", "list", *cluster]) == 0
    listed = capsys.readouterr().out
    assert all(any(line.split()[:2] == [job, "9"] for line in listed.splitlines()) for job in (finished, other))

    assert main(["topics", "delete", "--job", finished, *cluster]) == 0  # a dry run
    said = capsys.readouterr().out
    assert f"9 topics and 1 consumer groups of job {finished}" in said and "--yes" in said
    assert set(list_jobs(kafka_bootstrap)[finished]) == set(JobTopics(finished).all(["web"], 2))

    assert main(["topics", "delete", "--job", finished, "--yes", *cluster]) == 0
    assert f"deleted from {kafka_bootstrap}: 9 topics and 1 consumer groups" in capsys.readouterr().out
    assert finished not in list_jobs(kafka_bootstrap)
    assert job_groups(kafka_bootstrap, finished) == {}
    assert len(list_jobs(kafka_bootstrap)[other]) == 9
    assert job_groups(kafka_bootstrap, other) == {f"{other}.loaders.web": 0}

    assert main(["topics", "delete", "--job", finished, "--yes", *cluster]) == 0  # again: nothing left
    assert "has no topics or consumer groups" in capsys.readouterr().out


@pytest.mark.kafka
def test_a_running_job_is_not_deleted_unless_forced(
    kafka_bootstrap: str, unique_name: str, capsys: pytest.CaptureFixture
) -> None:
    ensure_job_topics(kafka_bootstrap, unique_name, ["web"], 1)
    group = f"{unique_name}.loaders.web"
    member = _group_member(kafka_bootstrap, group, JobTopics(unique_name).work("web"))
    try:
        cluster = ["--bootstrap-servers", kafka_bootstrap]
        assert main(["topics", "delete", "--job", unique_name, "--yes", *cluster]) == 5
        err = capsys.readouterr().err
        assert f"job {unique_name} is running" in err and f"{group} (1 members)" in err and "--force" in err
        assert len(list_jobs(kafka_bootstrap)[unique_name]) == 8

        assert main(["topics", "delete", "--job", unique_name, "--yes", "--force", *cluster]) == 0
        assert unique_name not in list_jobs(kafka_bootstrap)
        assert job_groups(kafka_bootstrap, unique_name) == {group: 1}  # a group with members stays
    finally:
        member.close()


def test_without_a_cluster_the_command_says_how_to_name_one(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    assert main(["topics", "list"]) == 2
    assert "--bootstrap-servers" in capsys.readouterr().err
