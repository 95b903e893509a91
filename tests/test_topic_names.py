"""Topic names: built, validated and parsed back."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topics.errors import InvalidNameError
from topics.formats.names import (
    MAX_JOB_LENGTH,
    MAX_SOURCE_LENGTH,
    MAX_TOPIC_LENGTH,
    JobTopics,
    TopicKind,
    TopicName,
    parse_topic,
    validate_job_name,
    validate_source_name,
)

LEGAL = string.ascii_letters + string.digits + "_-"
jobs = st.text(alphabet=LEGAL, min_size=1, max_size=MAX_JOB_LENGTH)
sources = st.text(alphabet=LEGAL, min_size=1, max_size=MAX_SOURCE_LENGTH)
illegal_names = st.text(min_size=1, max_size=30).filter(lambda s: any(c not in LEGAL for c in s))


def test_names_of_a_job() -> None:
    topics = JobTopics("pretrain-7b")
    assert topics.src("web") == "pretrain-7b.src.web"
    assert topics.work("web") == "pretrain-7b.work.web"
    assert topics.plan("web") == "pretrain-7b.plan.web"
    assert topics.rank(3) == "pretrain-7b.rank.3"
    assert (topics.state, topics.control, topics.dlq, topics.progress) == (
        "pretrain-7b.state",
        "pretrain-7b.control",
        "pretrain-7b.dlq",
        "pretrain-7b.progress",
    )
    assert topics.all(["a", "b"], 2) == [
        "pretrain-7b.src.a",
        "pretrain-7b.src.b",
        "pretrain-7b.work.a",
        "pretrain-7b.work.b",
        "pretrain-7b.plan.a",
        "pretrain-7b.plan.b",
        "pretrain-7b.rank.0",
        "pretrain-7b.rank.1",
        "pretrain-7b.state",
        "pretrain-7b.control",
        "pretrain-7b.dlq",
        "pretrain-7b.progress",
    ]


@settings(deadline=None, max_examples=200)
@given(job=jobs, source=sources, rank=st.integers(0, 10**6))
def test_every_valid_name_fits_kafka_and_parses_back(job: str, source: str, rank: int) -> None:
    topics = JobTopics(job)
    expected = {
        topics.src(source): TopicName(job, TopicKind.SRC, source),
        topics.work(source): TopicName(job, TopicKind.WORK, source),
        topics.plan(source): TopicName(job, TopicKind.PLAN, source),
        topics.rank(rank): TopicName(job, TopicKind.RANK, rank),
        topics.state: TopicName(job, TopicKind.STATE),
        topics.control: TopicName(job, TopicKind.CONTROL),
        topics.dlq: TopicName(job, TopicKind.DLQ),
        topics.progress: TopicName(job, TopicKind.PROGRESS),
    }
    for name, parts in expected.items():
        assert len(name) <= MAX_TOPIC_LENGTH
        assert parse_topic(name) == parts
        assert name.startswith(topics.prefix)


@settings(deadline=None, max_examples=100)
@given(name=illegal_names)
def test_illegal_characters_are_named(name: str) -> None:
    bad = {c for c in name if c not in LEGAL}
    with pytest.raises(InvalidNameError) as job_error:
        JobTopics(name)
    with pytest.raises(InvalidNameError) as source_error:
        JobTopics("j").src(name)
    for error, part in ((job_error, "job"), (source_error, "source")):
        message = str(error.value)
        assert message.startswith(f"{part} name")
        for c in bad:
            assert repr(c) in message


def test_dot_is_reserved() -> None:
    with pytest.raises(InvalidNameError, match="reserved as the topic name separator"):
        validate_source_name("web.en")
    with pytest.raises(InvalidNameError, match=r"job name 'a\.b'"):
        JobTopics("a.b")


@pytest.mark.parametrize(
    ("check", "limit"), [(validate_job_name, MAX_JOB_LENGTH), (validate_source_name, MAX_SOURCE_LENGTH)]
)
def test_length_limits(check, limit: int) -> None:
    assert check("x" * limit) == "x" * limit
    with pytest.raises(InvalidNameError, match=f"{limit + 1} characters long; at most {limit}"):
        check("x" * (limit + 1))


@pytest.mark.parametrize("bad", ["", None, 3, b"job"])
def test_empty_and_non_string_names(bad: object) -> None:
    with pytest.raises(InvalidNameError, match="job name"):
        validate_job_name(bad)


@pytest.mark.parametrize("bad", [-1, True, 1.0, "0"])
def test_bad_ranks(bad: object) -> None:
    with pytest.raises(InvalidNameError, match="rank"):
        JobTopics("j").rank(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ranks"):
        JobTopics("j").all(["a"], 0)


@pytest.mark.parametrize(
    "name", ["j", "j.src", "j.src.a.b", "j.rank.01", "j.rank.-1", "j.rank.x", "j.states", "j..state", ".state"]
)
def test_foreign_names_do_not_parse(name: str) -> None:
    with pytest.raises(InvalidNameError, match="not a mixflow topic name"):
        parse_topic(name)
