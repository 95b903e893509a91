"""A job on the secured broker (``secure_stack``) with a principal per role and the ACLs `mixflow acl apply`
grants: it runs end to end exactly once with shadows and a trainer; no password shows in any output, log,
report or record; and each refusal says the principal, the resource and the missing operation, writes
nothing, and fences nobody."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.cli import main
from pipeline.spec import load_spec
from pipeline.tools.stack.scram_users import ensure_users
from tests.loader_support import REPO, build_example_data, write_spec
from tests.secure_stack import SecureStack
from tests.sink_support import random_batch, write_steps
from topics.errors import MixflowError
from topics.formats.names import JobTopics
from topics.kafka.acl_admin import AclAdmin
from topics.kafka.acls import (
    EPHEMERAL_GROUP_PREFIX,
    Binding,
    Operation,
    Pattern,
    Resource,
    all_bindings,
    job_bindings,
)
from topics.kafka.admin import ensure_job_topics, ensure_loader_topics, list_jobs
from topics.kafka.authorization import AuthorizationError
from topics.kafka.clients import commit_or_abort, produce, transactional_producer
from topics.kafka.log_reader import read_to_end
from topics.kafka.offset_lookup import OffsetLookup
from trainer_sink.dataset import KafkaBatchDataset
from trainer_sink.read_options import ReadOptions

SENTINEL = "S3ntinel-acl"
PRINCIPALS = ("loader", "loader.topics", "constructor", "trainer", "observer", "operator")
TRAINER = (
    "{python} -m torch.distributed.run --standalone --nproc_per_node 2 examples/train.py --spec {spec} "
    "--out {out} --steps 12 --checkpoint-every 5 --resume --threads 1 --d-model 32 --layers 1 --heads 2 "
    "--vocab-size 1024"
)
REFUSED_EXIT = AuthorizationError.exit_code


def _variable(key: str) -> str:
    return "PW_" + key.upper().replace(".", "_")


@dataclass(frozen=True)
class SecuredJob:
    stack: SecureStack
    job: str
    spec: Path
    folder: Path
    env: dict[str, str]  # the roles' passwords, as their references name them

    def run(self, *args: str, timeout_s: float = 540) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "pipeline.cli", *args]
        return subprocess.run(command, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout_s)

    def config(self, role: str, source: str | None = None) -> dict:
        kafka = load_spec(self.spec).kafka
        return kafka.client_config(self.stack.bootstrap, self.env, role=role, source=source)

    def admin(self, job: str | None = None, *, apply: bool = True) -> None:
        action = "apply" if apply else "revoke"
        properties = str(self.stack.secrets.admin_properties)
        assert (
            main(["acl", action, "--spec", str(self.spec), "--job", job or self.job, "--admin-config", properties]) == 0
        )


@pytest.fixture(scope="module")
def secured_job(secure_stack: SecureStack, tmp_path_factory: pytest.TempPathFactory) -> SecuredJob:
    folder = tmp_path_factory.mktemp("acl-job")
    job = f"t{uuid.uuid4().hex[:8]}-acl"
    passwords = {key: f"{SENTINEL}-{key}-{uuid.uuid4().hex[:6]}" for key in PRINCIPALS}
    ensure_users(secure_stack.admin_config, {f"{job}-{key}": pw for key, pw in passwords.items()})
    kafka = {
        "bootstrap_servers": secure_stack.bootstrap,
        "config": {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "ssl.ca.location": str(secure_stack.secrets.ca),
        },
        "principals": {
            key: {"sasl.username": f"{job}-{key}", "sasl.password": {"env": _variable(key)}} for key in PRINCIPALS
        },
    }
    data = build_example_data(folder / "data", limit=12)
    step = {"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 512}
    spec = write_spec(folder, job, secure_stack.bootstrap, data, on_exhausted="renormalize", step=step, kafka=kafka)
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    env |= {_variable(key): pw for key, pw in passwords.items()}
    secured = SecuredJob(secure_stack, job, spec, folder, env)
    secured.admin()
    # Created by the operator's principal, as `mixflow run` does, so that each test can run alone.
    ensure_job_topics(secured.config("operator"), job, ["code", "docstrings", "topics"], step["ranks"])
    return secured


def _held(secured: SecuredJob, job: str) -> set[Binding]:
    spec = load_spec(secured.spec)
    planned = all_bindings(job_bindings(job, spec.source_names, spec.kafka.principals))
    held = AclAdmin(secured.stack.admin_config).granted({b.principal for b in planned})
    return {b for b in held if b in set(planned) and b.name.startswith(f"{job}.")}


def test_apply_creates_what_plan_prints_and_revoke_removes_it(secured_job: SecuredJob, capsys) -> None:
    other = f"{secured_job.job}-b"
    spec = load_spec(secured_job.spec)
    planned = {b for b in all_bindings(job_bindings(other, spec.source_names, spec.kafka.principals))}
    shared = {b for b in planned if not b.name.startswith(f"{other}.")}  # describe on groups mixflow-
    assert {b.name for b in shared} == {EPHEMERAL_GROUP_PREFIX}
    planned -= shared
    assert _held(secured_job, other) == set()
    secured_job.admin(other)
    assert _held(secured_job, other) == planned
    capsys.readouterr()
    secured_job.admin(other)
    there = len(planned) + len(shared)
    assert f"job {other}: created 0 bindings, {there} were there already, removed 0 not planned" in (
        capsys.readouterr().out
    )
    # A grant the plan does not hold (a loader's WRITE on the control topic) goes at the next apply.
    stale = Binding(
        f"User:{secured_job.job}-loader", Resource.TOPIC, Pattern.LITERAL, f"{other}.control", Operation.WRITE
    )
    AclAdmin(secured_job.stack.admin_config).create([stale])
    secured_job.admin(other)
    assert "removed 1 not planned" in capsys.readouterr().out
    assert _held(secured_job, other) == planned
    secured_job.admin(other, apply=False)
    assert _held(secured_job, other) == set()
    assert _held(secured_job, secured_job.job) != set()  # another job's bindings are left alone


def _dump(config: dict, topics: list[str]) -> bytes:
    """Every record of ``topics``, aborted ones too: keys, values and headers."""
    out = []
    for topic in topics:
        for message in read_to_end(config, topic, isolation="read_uncommitted"):
            out += [message.key() or b"", message.value() or b""]
            out += [value or b"" for _, value in message.headers() or []]
    return b"".join(out)


def test_a_job_runs_exactly_once_with_a_principal_per_role_and_shows_no_secret(secured_job: SecuredJob) -> None:
    state = secured_job.folder / "state"
    spec = str(secured_job.spec)
    ran = secured_job.run("run", "--spec", spec, "--state-dir", str(state), "--shadows", "1", "--trainer", TRAINER)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "each sample exactly once: yes" in ran.stdout, ran.stdout
    assert "every committed source sample reached a rank topic: yes" in ran.stdout
    assert "the trainer received every micro-batch exactly as written: yes (48 micro-batches on 2 ranks" in ran.stdout
    shown = [ran.stdout, ran.stderr]
    for args in (
        ["spec", "check", spec],
        ["acl", "plan", "--spec", spec],
        ["report", "--spec", spec, "--out", str(secured_job.folder / "report")],
        ["topics", "list", "--spec", spec],
        ["deploy", "render", "--spec", spec, "--out", str(secured_job.folder / "manifests")],
    ):
        done = secured_job.run(*args)
        assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
        shown += [done.stdout, done.stderr]
    assert all(SENTINEL not in text for text in shown)
    files = [path for path in secured_job.folder.rglob("*") if path.is_file() and "data" not in path.parts]
    assert len(files) > 10
    assert [path for path in files if SENTINEL.encode() in path.read_bytes()] == []
    topics = sorted(list_jobs(secured_job.stack.admin_config)[secured_job.job])
    assert SENTINEL.encode() not in _dump(secured_job.stack.admin_config, topics)


def test_a_sink_cannot_read_another_jobs_rank_topic(secured_job: SecuredJob) -> None:
    other = f"{secured_job.job}-c"
    ensure_job_topics(secured_job.stack.admin_config, other, ["code"], 2)
    with pytest.raises(AuthorizationError) as info:
        KafkaBatchDataset(
            job=other, kafka_config=secured_job.config("trainer"), rank=0, read=ReadOptions(wait_timeout_s=30)
        )
    principal = f"User:{secured_job.job}-trainer"
    assert f"refused {principal} DESCRIBE on topic {other}.rank.0 (asking for its metadata)" in str(info.value)


def _committed(secured: SecuredJob, topic: str) -> int:
    return len(read_to_end(secured.stack.admin_config, topic))


@pytest.mark.parametrize(("source", "target"), [("code", "rank.0"), ("code", "src.topics"), ("topics", "src.code")])
def test_a_loader_cannot_write_a_rank_topic_or_another_sources(
    secured_job: SecuredJob, source: str, target: str
) -> None:
    topic = f"{secured_job.job}.{target}"
    before = _committed(secured_job, topic)
    config = secured_job.config("loader", source)
    producer = transactional_producer(config, f"{secured_job.job}.loader.{source}.7", init_timeout_s=30)
    producer.begin_transaction()
    produce(producer, f"{secured_job.job}.src.{source}", b"a record of its own source")
    produce(producer, topic, b"not its topic")
    with pytest.raises(AuthorizationError) as info:
        commit_or_abort(producer, timeout_s=30)
    user = f"{secured_job.job}-loader" + (".topics" if source == "topics" else "")
    assert f"refused User:{user} WRITE on topic {topic} (committing a transaction)" in str(info.value)
    assert _committed(secured_job, topic) == before


def test_the_constructors_transactional_id_is_refused_to_others_and_its_holder_not_fenced(
    secured_job: SecuredJob,
) -> None:
    transactional_id = f"{secured_job.job}.constructor"
    holder = transactional_producer(secured_job.config("constructor"), transactional_id, init_timeout_s=30)
    holder.begin_transaction()
    dlq = JobTopics(secured_job.job).dlq
    before = _committed(secured_job, dlq)
    produce(holder, dlq, b"written by the constructor's principal")
    for role in ("loader", "trainer", "operator"):
        with pytest.raises(AuthorizationError) as info:
            transactional_producer(secured_job.config(role), transactional_id, init_timeout_s=30)
        user = f"{secured_job.job}-{role}"
        expected = f"refused User:{user} WRITE on transactional id {transactional_id} (initialising transactions)"
        assert expected in str(info.value)
    assert commit_or_abort(holder, timeout_s=30)  # not fenced: its transaction commits
    assert _committed(secured_job, dlq) == before + 1


def _state_records(config: dict, topic: str) -> int:
    consumer = Consumer({**config, "group.id": f"mixflow-test-{uuid.uuid4().hex[:8]}"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)[1]
    except KafkaException:
        return 0
    finally:
        consumer.close()


def test_a_role_whose_acl_is_removed_stops_with_the_reason_and_exactly_once_holds(secured_job: SecuredJob) -> None:
    job = f"{secured_job.job}-d"
    secured_job.admin(job)
    state = secured_job.folder / "state-d"
    command = [sys.executable, "-m", "pipeline.cli", "run", "--spec", str(secured_job.spec), "--job", job]
    run = subprocess.Popen(
        [*command, "--state-dir", str(state)],
        cwd=REPO,
        env=secured_job.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    state_topic = JobTopics(job).state
    deadline = time.monotonic() + 300
    while _state_records(secured_job.stack.admin_config, state_topic) < 10 and run.poll() is None:
        assert time.monotonic() < deadline, "the constructor wrote no 10 steps in 300 s"
        time.sleep(0.2)  # poll interval of the watermark probe
    principal = f"User:{secured_job.job}-constructor"
    writes_ranks = Binding(principal, Resource.TOPIC, Pattern.PREFIXED, f"{job}.rank.", Operation.WRITE)
    assert AclAdmin(secured_job.stack.admin_config).delete([writes_ranks]) == 1
    stdout, stderr = run.communicate(timeout=300)
    assert run.returncode != 0, stdout[-2000:]
    # Whichever call of the step's transaction meets the refusal first (a produce or the commit) names it.
    refusal = f"refused {principal} WRITE on topic {job}.rank.0, {job}.rank.1 ("
    assert refusal in stdout + stderr, stderr[-3000:]
    secured_job.admin(job)
    again = secured_job.run("run", *command[4:], "--state-dir", str(state))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "each sample exactly once: yes" in again.stdout, again.stdout
    assert "every committed source sample reached a rank topic: yes" in again.stdout


def test_a_loader_refused_its_work_group_stops_with_the_reason(secured_job: SecuredJob) -> None:
    group = f"{secured_job.job}.loaders.docstrings"
    reads_group = Binding(f"User:{secured_job.job}-loader", Resource.GROUP, Pattern.LITERAL, group, Operation.READ)
    admin = AclAdmin(secured_job.stack.admin_config)
    assert admin.delete([reads_group]) == 1
    try:
        spec = str(secured_job.spec)
        done = secured_job.run("load", "--spec", spec, "--source", "docstrings", "--until-drained", timeout_s=120)
    finally:
        admin.create([reads_group])
    assert done.returncode == REFUSED_EXIT, done.stderr[-2000:]
    principal = f"User:{secured_job.job}-loader"
    assert f"refused {principal} READ on group {group} (loader {secured_job.job}.loader.docstrings.0 joining it)" in (
        done.stderr
    )


def test_asking_what_a_group_committed_without_its_rights_is_refused_at_once(secure_stack: SecureStack) -> None:
    """A consumer asking a group it may not read only times out (librdkafka waits for a coordinator that never
    answers it); the lookup says it is refused, so a loader whose rights go while it checks its plan stops
    naming them instead of retrying for minutes."""
    user, password, topic = f"g{uuid.uuid4().hex[:8]}", uuid.uuid4().hex, f"offsets.{uuid.uuid4().hex[:8]}"
    admin = AdminClient(secure_stack.admin_config)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    ensure_users(secure_stack.admin_config, {user: password})
    reads = [
        Binding(f"User:{user}", Resource.TOPIC, Pattern.LITERAL, topic, op)
        for op in (Operation.READ, Operation.DESCRIBE)
    ]
    AclAdmin(secure_stack.admin_config).create(reads)
    lookup = OffsetLookup(secure_stack.client_config(user, password), group=f"{topic}.loaders")
    began = time.monotonic()
    try:
        with pytest.raises(AuthorizationError, match=f"refused User:{user} READ on group {topic}.loaders"):
            lookup.committed([TopicPartition(topic, 0)], timeout_s=5)
    finally:
        lookup.close()
    assert time.monotonic() - began < 30


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (b"mixture-change", b'{"kind":"mixture-change","id":"x","from_step":29,"shares":{"code":1.0}}'),
        (b"spec", b"not a spec record"),
    ],
)
def test_a_loader_cannot_steer_the_job_through_its_control_topic(
    secured_job: SecuredJob, key: bytes, value: bytes
) -> None:
    control = JobTopics(secured_job.job).control
    before = len(read_to_end(secured_job.stack.admin_config, control, isolation="read_uncommitted"))
    producer = Producer({**secured_job.config("loader", "code"), "enable.idempotence": True})
    failures: list = []
    producer.produce(control, value, key=key, on_delivery=lambda error, _: failures.append(error))
    producer.flush(30)
    assert failures and failures[0] is not None and failures[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert len(read_to_end(secured_job.stack.admin_config, control, isolation="read_uncommitted")) == before


def test_a_loader_creates_its_sources_topics_and_no_other(secured_job: SecuredJob) -> None:
    job = f"{secured_job.job}-f"
    secured_job.admin(job)
    loader = secured_job.config("loader", "code")
    topics = JobTopics(job)
    admin = AdminClient(loader)
    refused = admin.create_topics([NewTopic(topics.state, 1, 1), NewTopic(f"{job}.anything", 1, 1)])
    for name, future in refused.items():
        with pytest.raises(KafkaException) as info:
            future.result(timeout=30)
        assert info.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, name
    with pytest.raises(MixflowError, match=rf"topics {job}.control, {job}.dlq do not exist after 1 s"):
        ensure_loader_topics(loader, job, "code", wait_for_others_s=1)
    own = {topics.src("code"), topics.work("code"), topics.plan("code")}
    assert set(list_jobs(secured_job.stack.admin_config)[job]) == own
    ensure_job_topics(secured_job.config("operator"), job, ["code", "docstrings", "topics"], 2)
    assert ensure_loader_topics(loader, job, "code", wait_for_others_s=1) == []


def _role_bindings(secured: SecuredJob, job: str, key: str) -> list[Binding]:
    spec = load_spec(secured.spec)
    return job_bindings(job, spec.source_names, spec.kafka.principals)[key]


def _spec_of(secured: SecuredJob, job: str, **constructor: object) -> Path:
    body = yaml.safe_load(secured.spec.read_text())
    body["job"] = job
    body.setdefault("constructor", {}).update(constructor)
    path = secured.folder / f"{job}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def _started(secured: SecuredJob, *args: str, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "pipeline.cli", *args]
    with log.open("ab") as out:
        return subprocess.Popen(command, cwd=REPO, env=secured.env, stdout=out, stderr=subprocess.STDOUT)


def _wait_for_line(log: Path, text: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        assert process.poll() is None, (
            f"the role exited ({process.returncode}) before it said {text!r}:\n{log.read_text()[-3000:]}"
        )
        assert time.monotonic() < deadline, (
            f"the role did not say {text!r} within {timeout_s} s:\n{log.read_text()[-3000:]}"
        )
        time.sleep(0.1)  # polling a log file, which has no event to wait on


CASES = {"constructor waiting for samples": "c", "constructor held by its lead": "l", "loader": "o"}


@pytest.mark.parametrize("case", list(CASES))
def test_a_role_whose_rights_are_revoked_stops_within_30_s_naming_them(secured_job: SecuredJob, case: str) -> None:
    job = f"{secured_job.job}-r{CASES[case]}"
    secured_job.admin(job)
    ensure_job_topics(secured_job.config("operator"), job, ["code", "docstrings", "topics"], 2)
    log = secured_job.folder / f"{job}.log"
    spec = str(_spec_of(secured_job, job, max_lead_steps=2) if "lead" in case else _spec_of(secured_job, job))
    if case == "loader":
        key, principal = "loader", f"User:{secured_job.job}-loader"
        process = _started(secured_job, "load", "--spec", spec, "--source", "code", log=log)
        _wait_for_line(log, "published", process, 120)
    else:
        key, principal = "constructor", f"User:{secured_job.job}-constructor"
        if "lead" in case:
            for source in ("code", "docstrings", "topics"):
                loaded = _started(secured_job, "load", "--spec", spec, "--source", source, "--until-drained", log=log)
                assert loaded.wait(120) == 0, log.read_text()[-3000:]
        process = _started(secured_job, "construct", "--spec", spec, log=log)
        _wait_for_line(log, "waits for the trainers" if "lead" in case else "step 0 waits for source", process, 120)
    AclAdmin(secured_job.stack.admin_config).delete(_role_bindings(secured_job, job, key))
    revoked = time.monotonic()
    try:
        code = process.wait(45)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"the {key} did not stop within 45 s of losing its rights:\n{log.read_text()[-4000:]}")
    took = time.monotonic() - revoked
    text = log.read_text()
    last = text.strip().splitlines()[-1]
    assert code == REFUSED_EXIT and took < 30, (code, took, text[-3000:])
    assert last.startswith(f"mixflow {'load' if case == 'loader' else 'construct'}: error: "), last
    assert f"refused {principal} " in last and f" {job}." in last, last


def test_a_role_stopped_with_sigterm_after_its_rights_are_revoked_exits_within_seconds(secured_job: SecuredJob) -> None:
    job = f"{secured_job.job}-s"
    secured_job.admin(job)
    ensure_job_topics(secured_job.config("operator"), job, ["code", "docstrings", "topics"], 2)
    log = secured_job.folder / f"{job}.log"
    process = _started(secured_job, "construct", "--spec", str(_spec_of(secured_job, job)), log=log)
    _wait_for_line(log, "holds the constructor lease", process, 120)
    secured_job.admin(job, apply=False)
    process.send_signal(signal.SIGTERM)
    asked = time.monotonic()
    try:
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
    assert time.monotonic() - asked < 5, log.read_text()[-3000:]


def test_another_jobs_topics_are_refused_not_reported_missing(secured_job: SecuredJob) -> None:
    """A job the principal may not see lists as empty, as a missing one does; asked for by name, Kafka refuses
    to describe its topics whether they exist or not, and that refusal is what is said (exit 5)."""
    other = f"{secured_job.job}-e"
    ensure_job_topics(secured_job.stack.admin_config, other, ["code"], 2)
    spec = str(secured_job.spec)
    for args, role in (
        (["topics", "delete", "--spec", spec, "--job", other, "--yes"], "operator"),
        (["report", "--spec", spec, "--job", other, "--out", str(secured_job.folder / "report-e")], "observer"),
        (["top", "--spec", spec, "--job", other, "--once"], "observer"),
        (["top", "--spec", spec, "--job", f"{secured_job.job}-never", "--once"], "observer"),
    ):
        done = secured_job.run(*args, timeout_s=120)
        assert done.returncode == REFUSED_EXIT, (args, done.stdout[-1000:], done.stderr[-1000:])
        job = args[args.index("--job") + 1]
        refused = f"refused User:{secured_job.job}-{role} DESCRIBE on topic {job}.control (asking whether job {job}"
        assert refused in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"{other}.control" in list_jobs(secured_job.stack.admin_config)[other], "a refused delete deleted"


def test_a_loader_refused_the_topics_configs_stops_with_the_reason(secured_job: SecuredJob) -> None:
    spec = load_spec(secured_job.spec)
    principal = f"User:{secured_job.job}-loader"
    planned = all_bindings(job_bindings(secured_job.job, spec.source_names, spec.kafka.principals))
    describes_configs = [b for b in planned if b.principal == principal and b.operation is Operation.DESCRIBE_CONFIGS]
    assert describes_configs, "the loader is granted no DESCRIBE_CONFIGS to take away"
    admin = AclAdmin(secured_job.stack.admin_config)
    assert admin.delete(describes_configs) == len(describes_configs)
    try:
        done = secured_job.run("load", "--spec", str(secured_job.spec), "--source", "docstrings", timeout_s=120)
    finally:
        admin.create(describes_configs)
    assert done.returncode == REFUSED_EXIT, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if "refused" in line]
    assert len(said) == 1 and f"refused {principal} DESCRIBE_CONFIGS on topic {secured_job.job}." in said[0], said
    assert "(reading its config)" in said[0]


def test_a_sink_whose_rights_are_revoked_while_it_waits_raises_the_refusal_within_30_s(secured_job: SecuredJob) -> None:
    job = f"{secured_job.job}-t"
    secured_job.admin(job)
    ensure_job_topics(secured_job.config("operator"), job, ["code", "docstrings", "topics"], 2)
    sink = KafkaBatchDataset(
        job=job, kafka_config=secured_job.config("trainer"), rank=0, read=ReadOptions(wait_timeout_s=120)
    )
    batches = iter(sink)
    outcome: list[BaseException] = []
    reading = threading.Thread(target=lambda: outcome.append(_raised(lambda: next(batches))), daemon=True)
    reading.start()
    AclAdmin(secured_job.stack.admin_config).delete(_role_bindings(secured_job, job, "trainer"))
    revoked = time.monotonic()
    reading.join(45)
    try:
        assert not reading.is_alive(), "the sink still waits 45 s after losing its rights"
        assert time.monotonic() - revoked < 30
        [error] = outcome
        assert isinstance(error, AuthorizationError), error
        assert f"refused User:{secured_job.job}-trainer " in str(error), error
        assert f"on topic {job}.rank.0" in str(error) or "DESCRIBE on group mixflow-" in str(error), error
    finally:
        batches.close()


def _raised(call: Callable[[], object]) -> BaseException | None:
    try:
        call()
    except BaseException as exc:  # handed to the test's thread to check
        return exc
    return None


def test_a_trainer_per_rank_reads_its_own_rank_topic_and_is_refused_anothers(
    secured_job: SecuredJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``{rank}`` in the trainer's principal: each rank's sink, made from the spec, runs as its own user and reads
    its rank topic; rank 0's user is refused rank 1's topic in one line (exit 5); `acl revoke` takes it all back."""
    stack, job = secured_job.stack, f"{secured_job.job}-p"
    passwords = {rank: f"{SENTINEL}-rank{rank}-{uuid.uuid4().hex[:6]}" for rank in range(2)}
    ensure_users(stack.admin_config, {f"{job}-trainer-{rank}": pw for rank, pw in passwords.items()})
    body = yaml.safe_load(secured_job.spec.read_text())
    body["job"] = job
    body["kafka"]["principals"]["trainer"] = {
        "sasl.username": f"{job}-trainer-{{rank}}",
        "sasl.password": {"env": "PW_TRAINER_{rank}"},
    }
    spec = secured_job.folder / f"{job}.yaml"
    spec.write_text(yaml.safe_dump(body, sort_keys=False))
    for rank, password in passwords.items():
        monkeypatch.setenv(f"PW_TRAINER_{rank}", password)
    rng = np.random.default_rng(7)
    step = body["step"]
    batches = [
        [random_batch(rng, s, r, 2, step["micro_batches"], step["tokens_per_micro_batch"]) for r in range(2)]
        for s in range(3)
    ]
    write_steps(stack.admin_config, job, batches)
    properties = str(stack.secrets.admin_properties)
    assert main(["acl", "apply", "--spec", str(spec), "--admin-config", properties]) == 0
    read = ReadOptions(wait_timeout_s=30)
    for rank in range(2):
        sink = KafkaBatchDataset(spec, bootstrap_servers=stack.bootstrap, rank=rank, read=read)
        assert sink.kafka_config["sasl.username"] == f"{job}-trainer-{rank}"
        got = [(m["step"], m["rank"], m["sample_ids"]) for m in sink]
        expected = [
            (b.step, rank, [i for i, m in zip(b.sample_ids, b.micro_batch, strict=True) if m == k])
            for b in (steps[rank] for steps in batches)
            for k in range(b.micro_batches)
        ]
        assert got == expected
    rank_0 = load_spec(spec).kafka.client_config(stack.bootstrap, role="trainer", rank=0)
    refused = KafkaBatchDataset(job=job, kafka_config=rank_0, rank=1, read=read, report_progress=False)
    with pytest.raises(AuthorizationError) as info:
        next(iter(refused))
    said = str(info.value)
    assert f"refused User:{job}-trainer-0 READ on topic {job}.rank.1 (reading it)" in said, said
    assert "\n" not in said and info.value.exit_code == REFUSED_EXIT
    assert SENTINEL not in said
    assert main(["acl", "revoke", "--spec", str(spec), "--admin-config", properties]) == 0
    principals = {f"User:{job}-trainer-{rank}" for rank in range(2)}
    assert {b for b in AclAdmin(stack.admin_config).granted(principals) if b.name.startswith(f"{job}.")} == set()
