"""The ACLs of a job's roles, computed from its spec: every resource a role touches is covered, nothing is
written outside the job, one job's principals reach nothing of another's, and the count does not grow with
the ranks."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from pipeline.cli import main
from topics.formats.names import JobTopics
from topics.formats.topic_layout import job_layout
from topics.kafka.acls import (
    EPHEMERAL_GROUP_PREFIX,
    Binding,
    JobNames,
    Operation,
    Pattern,
    Resource,
    all_bindings,
    allowed,
    job_bindings,
)

R, W, D = Operation.READ, Operation.WRITE, Operation.DESCRIBE
TOPIC, GROUP, TXN = Resource.TOPIC, Resource.GROUP, Resource.TRANSACTIONAL_ID
Access = tuple[Resource, str, Operation]

_names = st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=12)


def _principals(sources: list[str], own_loaders: list[str]) -> dict[str, dict[str, str]]:
    out = {
        role: {"sasl.username": f"u-{role}"} for role in ("loader", "constructor", "trainer", "observer", "operator")
    }
    out |= {f"loader.{s}": {"sasl.username": f"u-loader-{s}"} for s in own_loaders}
    return out


def _job_topics(job: str, sources: list[str], ranks: int, lanes: int) -> list[str]:
    return [spec.name for spec in job_layout(job, sources, ranks, lanes=lanes)]


def _creates_topics(job: str, sources: list[str], ranks: int, lanes: int) -> list[Access]:
    """``ensure_job_topics``: list them, create the missing ones, check their configs."""
    topics = _job_topics(job, sources, ranks, lanes)
    return [(TOPIC, t, op) for t in topics for op in (D, Operation.CREATE, Operation.DESCRIBE_CONFIGS)]


def _touched_by_loader(job: str, source: str) -> list[Access]:
    t = JobTopics(job)
    own = [t.src(source), t.work(source), t.plan(source)]
    return [
        *[(TOPIC, name, op) for name in own for op in (D, Operation.CREATE, Operation.DESCRIBE_CONFIGS)],
        *[(TOPIC, name, op) for name in (t.control, t.dlq) for op in (D, Operation.DESCRIBE_CONFIGS)],
        (TOPIC, t.src(source), W),
        (TOPIC, t.work(source), R),
        (TOPIC, t.work(source), W),
        (TOPIC, t.plan(source), R),
        (TOPIC, t.plan(source), W),
        (TOPIC, t.control, R),
        (TOPIC, t.dlq, W),
        (GROUP, f"{job}.loaders.{source}", R),
        (GROUP, f"{EPHEMERAL_GROUP_PREFIX}reader-0a1b2c", D),
        *[(TXN, f"{job}.loader.{source}.{instance}", W) for instance in (0, 1, 17)],
        (TXN, f"{job}.planner.{source}", W),
    ]


def _touched_by_constructor(job: str, sources: list[str], ranks: int, lanes: int) -> list[Access]:
    t = JobTopics(job)
    lane_names = [f"{job}.constructor"] + [f"{job}.constructor.lane{j}" for j in range(lanes if lanes > 1 else 0)]
    return [
        *_creates_topics(job, sources, ranks, lanes),
        *[(TOPIC, t.src(s), R) for s in sources],
        *[(TOPIC, t.plan(s), R) for s in sources],
        *[(GROUP, f"{job}.loaders.{s}", D) for s in sources],
        *[(TOPIC, t.rank(r), op) for r in range(ranks) for op in (R, W)],
        (TOPIC, t.state, R),
        (TOPIC, t.state, W),
        (TOPIC, t.control, R),
        (TOPIC, t.control, W),
        (TOPIC, t.dlq, W),
        (TOPIC, t.progress, R),
        (GROUP, f"{job}.progress-reader", R),
        (GROUP, f"{EPHEMERAL_GROUP_PREFIX}step-index-0a1b2c", D),
        *[(GROUP, name, R) for name in lane_names],
        *[(GROUP, f"{name}.lease", R) for name in lane_names],
        *[(GROUP, f"{name}.lease", D) for name in lane_names],
        *[(TXN, name, W) for name in lane_names],
    ]


def _touched_by_trainer(job: str, rank: int) -> list[Access]:
    t = JobTopics(job)
    return [
        (TOPIC, t.rank(rank), R),
        (TOPIC, t.rank(rank), D),
        (TOPIC, t.progress, W),
        (GROUP, f"{EPHEMERAL_GROUP_PREFIX}sink-0a1b2c", D),
    ]


def _touched_by_observer(job: str, sources: list[str], ranks: int, lanes: int) -> list[Access]:
    groups = [f"{job}.loaders.{s}" for s in sources] + [f"{job}.constructor", f"{job}.constructor.lease"]
    return [
        *[(TOPIC, name, op) for name in _job_topics(job, sources, ranks, lanes) for op in (R, D)],
        *[(GROUP, name, D) for name in groups],
        (GROUP, f"{EPHEMERAL_GROUP_PREFIX}top-0a1b2c", D),
    ]


def _uncovered(bindings: list[Binding], principal: str, accesses: list[Access]) -> list[Access]:
    return [access for access in accesses if not allowed(bindings, principal, *access)]


_jobs = st.fixed_dictionaries(
    {
        "job": _names,
        "sources": st.lists(_names, min_size=1, max_size=4, unique=True),
        "ranks": st.integers(1, 64),
        "lanes": st.integers(1, 3),
        "own": st.integers(0, 4),
    }
)


@given(_jobs)
def test_every_resource_a_role_touches_is_covered(case: dict) -> None:
    job, sources, ranks, lanes = case["job"], case["sources"], case["ranks"], case["lanes"]
    own = sources[: case["own"]]
    by_key = job_bindings(job, sources, _principals(sources, own))
    bindings = all_bindings(by_key)
    for source in sources:
        principal = f"User:u-loader-{source}" if source in own else "User:u-loader"
        assert _uncovered(bindings, principal, _touched_by_loader(job, source)) == []
    assert _uncovered(bindings, "User:u-constructor", _touched_by_constructor(job, sources, ranks, lanes)) == []
    for rank in {0, ranks - 1}:
        assert _uncovered(bindings, "User:u-trainer", _touched_by_trainer(job, rank)) == []
    for role in ("observer", "operator"):
        assert _uncovered(bindings, f"User:u-{role}", _touched_by_observer(job, sources, ranks, lanes)) == []
    operator_writes = [(TOPIC, JobTopics(job).control, W)] + [
        (TOPIC, t, Operation.DELETE) for t in _job_topics(job, sources, ranks, lanes)
    ]
    assert _uncovered(bindings, "User:u-operator", operator_writes) == []


@given(_jobs, _names)
def test_nothing_is_granted_outside_the_job_and_no_role_writes_what_is_not_its_own(case: dict, other: str) -> None:
    job, sources, ranks, lanes = case["job"], case["sources"], case["ranks"], case["lanes"]
    own = sources[: case["own"]]
    bindings = all_bindings(job_bindings(job, sources, _principals(sources, own)))
    for b in bindings:
        in_job = b.name.startswith(f"{job}.")
        assert in_job or (b.resource is GROUP and b.name == EPHEMERAL_GROUP_PREFIX and b.operation is D), str(b)
    if other != job:  # another job's resources, whatever their names: nothing of them is reached
        theirs = _touched_by_constructor(other, sources, ranks, lanes) + _touched_by_observer(other, sources, ranks, 1)
        theirs = [a for a in theirs if not a[1].startswith(EPHEMERAL_GROUP_PREFIX)]
        for principal in {b.principal for b in bindings}:
            assert _uncovered(bindings, principal, theirs) == theirs
    t = JobTopics(job)
    # A loader writes nothing that steers the job and creates no topic but its source's three.
    not_loaders = [(TOPIC, t.rank(r), W) for r in range(ranks)] + [(TOPIC, t.state, W), (TXN, f"{job}.constructor", W)]
    not_loaders += [(TOPIC, t.control, W), (TOPIC, f"{job}.anything", Operation.CREATE)]
    not_loaders += [(TOPIC, name, Operation.CREATE) for name in (t.state, t.control, t.dlq, t.progress, t.rank(0))]
    for source in sources:
        principal = f"User:u-loader-{source}" if source in own else "User:u-loader"
        others = [s for s in sources if s != source and (s in own or source in own)]
        refused = [
            *not_loaders,
            *[(TOPIC, name, op) for s in others for name in (t.src(s), t.plan(s)) for op in (W, Operation.CREATE)],
            *[(TXN, f"{job}.loader.{s}.0", W) for s in others],
        ]
        assert _uncovered(bindings, principal, refused) == refused
    trainer_refused = [
        (TOPIC, t.rank(0), W),
        (TOPIC, t.state, R),
        (TOPIC, t.src(sources[0]), R),
        (TXN, f"{job}.constructor", W),
    ]
    assert _uncovered(bindings, "User:u-trainer", trainer_refused) == trainer_refused
    observer_writes = [(TOPIC, name, W) for name in _job_topics(job, sources, ranks, lanes)]
    assert _uncovered(bindings, "User:u-observer", observer_writes) == observer_writes


@given(st.lists(_names, min_size=1, max_size=4, unique=True), st.integers(1, 10_000))
def test_the_count_follows_the_sources_not_the_ranks(sources: list[str], ranks: int) -> None:
    del ranks  # the bindings do not depend on it
    count = len(all_bindings(job_bindings("j", sources, _principals(sources, []))))
    assert count == 41 + 14 * len(sources)


def test_a_role_without_a_user_gets_nothing() -> None:
    by_key = job_bindings("j", ["a"], {"trainer": {"sasl.username": "t"}, "observer": {}})
    assert list(by_key) == ["trainer"]
    assert {b.principal for b in by_key["trainer"]} == {"User:t"}
    assert JobNames("j", ("a",)).loader_transactional_prefix("a") == "j.loader.a."


def _spec(tmp_path: Path, sources: int, ranks: int) -> Path:
    names = ["code", "docstrings", "topics", "math"][:sources]
    spec = {
        "job": "big",
        "kafka": {
            "config": {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"},
            "principals": {
                role: {"sasl.username": f"big-{role}", "sasl.password": {"env": f"PW_{role.upper()}"}}
                for role in ("loader", "constructor", "trainer", "observer", "operator")
            },
        },
        "tokenizer": "tok.json",
        "sources": [{"name": n, "reader": "jsonl", "path": f"data/{n}"} for n in names],
        "mixture": {"weights": dict.fromkeys(names, 1)},
        "step": {"ranks": ranks, "micro_batches": 2, "tokens_per_micro_batch": 8192},
        "cost": {"alpha": 1.0, "beta": 10.0},
    }
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_plan_of_a_3_source_1024_rank_job(tmp_path: Path, capsys) -> None:
    assert main(["acl", "plan", "--spec", str(_spec(tmp_path, 3, 1024))]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "job big: 83 bindings for 5 principals"
    assert "allow write            topic            prefixed big.rank." in out
    assert "trainer (User:big-trainer): 4 bindings" in out
    assert main(["acl", "plan", "--spec", str(_spec(tmp_path, 3, 1024)), "--json"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 83


def test_an_authorization_refusal_no_caller_named_exits_as_refused(capsys) -> None:
    from confluent_kafka import KafkaError, KafkaException

    from pipeline.cli.boundary import failure_exit

    error = KafkaException(
        KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Fetch failed: Topic authorization failed")
    )
    assert failure_exit("construct", error, verbose=False) == 5
    err = capsys.readouterr().err
    assert err.startswith("mixflow construct: error: Kafka refused an operation this client's ACLs do not grant: ")
    assert err.count("\n") == 1


def _per_rank(principals: dict[str, dict[str, str]]) -> dict[str, dict[str, object]]:
    trainer = {"sasl.username": "u-trainer-{rank}", "sasl.password": {"env": "PW_TRAINER_{rank}"}}
    return {**principals, "trainer": trainer}


@given(_jobs)
def test_a_trainer_per_rank_reads_its_own_rank_topic_and_no_other(case: dict) -> None:
    job, sources, ranks, lanes = case["job"], case["sources"], case["ranks"], case["lanes"]
    by_key = job_bindings(job, sources, _per_rank(_principals(sources, [])), ranks)
    bindings = all_bindings(by_key)
    t = JobTopics(job)
    assert {b.principal for b in by_key["trainer"]} == {f"User:u-trainer-{r}" for r in range(ranks)}
    reads = [b for b in by_key["trainer"] if b.resource is TOPIC and b.operation is R]
    assert sorted((b.principal, b.pattern, b.name) for b in reads) == sorted(
        (f"User:u-trainer-{r}", Pattern.LITERAL, t.rank(r)) for r in range(ranks)
    )
    for rank in {0, ranks // 2, ranks - 1}:
        principal = f"User:u-trainer-{rank}"
        assert _uncovered(bindings, principal, _touched_by_trainer(job, rank)) == []
        others = [(TOPIC, t.rank(r), R) for r in range(ranks) if r != rank] + [(TOPIC, t.rank(ranks), R)]
        refused = [*others, (TOPIC, t.rank(rank), W), (TOPIC, t.state, R), (TOPIC, t.src(sources[0]), R)]
        assert _uncovered(bindings, principal, refused) == refused
    # The other roles are granted as with one trainer principal; the shared one is gone.
    assert _uncovered(bindings, "User:u-constructor", _touched_by_constructor(job, sources, ranks, lanes)) == []
    assert "User:u-trainer" not in {b.principal for b in bindings}
    shared = all_bindings(job_bindings(job, sources, _principals(sources, [])))
    assert len(bindings) == len(shared) - 4 + 4 * ranks


def test_a_trainer_per_rank_needs_the_ranks_and_a_user() -> None:
    per_rank = {"trainer": {"sasl.username": "t-{rank}"}}
    with pytest.raises(ValueError, match=r"a principal per rank \(\{rank\}\): give the job's ranks"):
        job_bindings("j", ["a"], per_rank)
    # {rank} in a password alone: one principal, granted each rank topic by name.
    one = job_bindings("j", ["a"], {"trainer": {"sasl.username": "t", "sasl.password": {"env": "P_{rank}"}}}, 2)
    assert [b.name for b in one["trainer"] if b.operation is R] == ["j.rank.0", "j.rank.1"]
    assert job_bindings("j", ["a"], {"trainer": {"sasl.password": {"env": "P_{rank}"}}}, 2) == {}


def test_plan_of_a_job_with_a_trainer_per_rank_lists_each_ranks_literal_bindings(tmp_path: Path, capsys) -> None:
    path = _spec(tmp_path, 3, 4)
    body = yaml.safe_load(path.read_text())
    body["kafka"]["principals"]["trainer"] = {
        "sasl.username": "big-trainer-{rank}",
        "sasl.password": {"env": "P{rank}"},
    }
    path.write_text(yaml.safe_dump(body))
    assert main(["acl", "plan", "--spec", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"job big: {83 - 4 + 4 * 4} bindings for 8 principals"
    for rank in range(4):
        assert f"trainer (User:big-trainer-{rank}): 4 bindings\n" in out
        assert f"  allow read             topic            literal  big.rank.{rank}\n" in out
    assert "big.rank.4" not in out
    reads = [line for line in out.splitlines() if line.startswith("  allow read ") and "big.rank." in line]
    assert [line for line in reads if "prefixed" in line] == [
        "  allow read             topic            prefixed big.rank."
    ]
    assert main(["acl", "plan", "--spec", str(path), "--json"]) == 0
    planned = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    trainer_reads = [p for p in planned if p["principal"].startswith("User:big-trainer-") and p["operation"] == "read"]
    assert [(p["pattern"], p["name"]) for p in trainer_reads] == [("literal", f"big.rank.{r}") for r in range(4)]
