"""Storage faults against a real S3 server (versitygw): outages shorter than the retry deadline are ridden out,
longer ones reported; permanent faults (wrong credentials, no such bucket, an endpoint that never answers, a
prefix with no object) are one message naming bucket, key and reason; a server restarted and a loader killed
mid-job lose and repeat nothing."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from botocore.stub import Stubber

from connectors.planning import split_file
from connectors.readers import Document, make_reader
from connectors.storage import (
    ObjectChangedError,
    ObjectMissingError,
    StorageAccessError,
    StorageError,
    StorageNotFoundError,
    StorageUnavailableError,
    storage_for,
)
from connectors.storage.faults import classify
from connectors.storage.retry import STORAGE_RETRY, TransientError
from connectors.storage.s3 import FIRST_CONTACT_S, S3Settings, S3Storage
from pipeline.cli import main
from pipeline.kafka.work_plan import publish_work_plan
from pipeline.roles.loader.source_runtime import SourceRuntime
from pipeline.roles.loader.source_storage import source_storage
from pipeline.roles.loader.topic_partitions import partition_count
from pipeline.spec import load_spec
from tests.kafka_support import TopicGrowth
from tests.loader_support import (
    build_example_data,
    committed_sample_ids,
    dead_letters,
    expected_sample_ids,
    start_loader,
    wait_all,
    write_spec,
)
from tests.s3_support import S3Server, running_server, storage_section, upload
from tests.test_s3_job import object_store_spec
from tests.test_s3_readers import write_source
from topics.formats.names import JobTopics
from topics.kafka.admin import ensure_job_topics


@pytest.fixture
def server(tmp_path: Path) -> Iterator[S3Server]:
    with running_server(tmp_path / "s3") as running:
        yield running


class RetrySeen(logging.Handler):
    """Set once the retry policy has logged a failed try."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.event.set()


def planned_parquet(server: S3Server, tmp_path: Path, deadline_s: float):
    folder = tmp_path / "src"
    write_source(folder, "parquet", [40, 40])
    root = upload(server, folder, "faults")
    storage = storage_for(root, server.settings(retry=replace(STORAGE_RETRY, deadline_s=deadline_s)))
    reader = make_reader("parquet", "web", root, storage=storage)
    units = [u for layout in reader.layouts() for u in split_file("web", layout, 1 << 30)]
    return reader, units, root


def test_an_outage_shorter_than_the_deadline_is_ridden_out(server: S3Server, tmp_path: Path) -> None:
    reader, units, _ = planned_parquet(server, tmp_path, deadline_s=60)
    expected = [(d.document_id, d.text) for d in reader.read(units[0]) if isinstance(d, Document)]
    seen = RetrySeen()
    logging.getLogger("connectors.storage.retry").addHandler(seen)
    server.stop()
    got: list = []
    reading = threading.Thread(target=lambda: got.extend(reader.read(units[0])))
    try:
        reading.start()
        assert seen.event.wait(30), "the read did not fail while the server was down"
        server.start()
        reading.join(60)
    finally:
        logging.getLogger("connectors.storage.retry").removeHandler(seen)
    assert not reading.is_alive()
    assert [(d.document_id, d.text) for d in got] == expected


def test_an_outage_past_the_deadline_is_reported_naming_the_object(server: S3Server, tmp_path: Path) -> None:
    reader, units, root = planned_parquet(server, tmp_path, deadline_s=1)
    server.stop()
    with pytest.raises(StorageUnavailableError) as info:
        list(reader.read(units[0]))
    message = str(info.value)
    assert f"{root}/{units[0].path}" in message and f"endpoint {server.endpoint} did not answer" in message


def spec_check(spec: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["spec", "check", "--files", str(spec)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            {"credentials": {"access_key_id": {"env": "MIXFLOW_TEST_S3_KEY"}, "secret_access_key": {"file": "wrong"}}},
            "access denied (403 SignatureDoesNotMatch",
        ),
        ({"endpoint_url": "http://127.0.0.1:9"}, "endpoint http://127.0.0.1:9 did not answer"),
    ],
)
def test_spec_check_names_the_bucket_and_the_storage_s_reason(
    server: S3Server, tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict, reason: str
) -> None:
    (tmp_path / "wrong").write_text("not-the-secret")
    data = build_example_data(tmp_path / "data", limit=3)
    upload(server, data / "code", "chk/code")
    spec = object_store_spec(write_spec(tmp_path, "chk", "127.0.0.1:9092", data), tmp_path, server, "chk", "chk")
    body = yaml.safe_load(spec.read_text())
    body["sources"] = body["sources"][:1]
    body["mixture"] = {"weights": {"code": 1}}
    body["storage"].update(change)
    body["storage"]["retry_deadline_s"] = 1
    spec.write_text(yaml.safe_dump(body))
    code, err = spec_check(spec, capsys)
    assert code == 2 and "sources[0].path" in err and "s3://corpus/chk/code" in err and reason in err, err


@pytest.mark.parametrize(
    ("path", "reason", "code"),
    [
        ("s3://no-such-bucket/code", "s3://no-such-bucket/code: no such bucket", 2),
        ("s3://corpus/no/such/prefix", "source code: no object under s3://corpus/no/such/prefix matches", 2),
    ],
)
def test_spec_check_names_a_missing_bucket_or_prefix(
    server: S3Server, tmp_path: Path, capsys: pytest.CaptureFixture[str], path: str, reason: str, code: int
) -> None:
    data = build_example_data(tmp_path / "data", limit=3)
    upload(server, data / "code", "chk/code")
    spec = object_store_spec(write_spec(tmp_path, "chk", "127.0.0.1:9092", data), tmp_path, server, "chk", "chk")
    body = yaml.safe_load(spec.read_text())
    body["sources"] = body["sources"][:1]
    body["sources"][0]["path"] = path
    body["mixture"] = {"weights": {"code": 1}}
    spec.write_text(yaml.safe_dump(body))
    got, err = spec_check(spec, capsys)
    assert got == code and reason in err, err


@pytest.mark.kafka
def test_a_loader_with_wrong_credentials_stops_with_one_line(
    kafka_bootstrap: str, server: S3Server, tmp_path: Path, unique_name: str
) -> None:
    data = build_example_data(tmp_path / "data", limit=3)
    upload(server, data / "code", f"{unique_name}/code")
    local = write_spec(tmp_path, unique_name, kafka_bootstrap, data)
    spec = object_store_spec(local, tmp_path, server, unique_name, unique_name)
    (tmp_path / "wrong").write_text("not-the-secret")
    body = yaml.safe_load(spec.read_text())
    body["storage"]["credentials"]["secret_access_key"] = {"file": str(tmp_path / "wrong")}
    spec.write_text(yaml.safe_dump(body))
    process = start_loader(spec, "code", 0, tmp_path)
    assert process.wait(120) == 5
    lines = (tmp_path / "loader-code-0.log").read_text().strip().splitlines()
    assert lines[-1].startswith(f"mixflow load: error: s3://corpus/{unique_name}/code: access denied"), lines[-5:]
    assert "not-the-secret" not in "\n".join(lines)


def wait_for_log(folder: Path, text: str, still_running: Callable[[], bool], timeout_s: float) -> None:
    """Return once a loader's log under ``folder`` holds ``text``."""
    deadline = time.monotonic() + timeout_s
    while not any(text in log.read_text() for log in folder.glob("loader-*.log")):
        assert still_running(), f"the loaders ended before their logs said {text!r}"
        assert time.monotonic() < deadline, f"no loader log said {text!r} within {timeout_s} s"
        time.sleep(0.05)  # polling log files, which have no event to wait on


def big_jsonl_source(data: Path, files: int = 3, lines: int = 4_000) -> Path:
    """JSONL files of about 1.5 MB each: over the listing-only size, so each is planned line by line."""
    folder = data / "docstrings-big"
    folder.mkdir(parents=True)
    words = ["def", "return", "value", "the", "list", "of", "items", "index", "error", "string", "number"]
    for f in range(files):
        rows = (" ".join(words[(f + r * 7 + k) % len(words)] for k in range(60 + r % 20)) for r in range(lines))
        (folder / f"part-{f}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in rows))
    return folder


@pytest.mark.kafka
def test_a_server_restart_and_a_killed_loader_mid_job_lose_and_repeat_nothing(
    kafka_bootstrap: str, server: S3Server, tmp_path: Path, unique_name: str
) -> None:
    """Units of a few KiB, so that the job is hundreds of units: the server stops at the first 500 samples
    and starts again once the loader has retried; the loader is killed 500 samples later and started again."""
    data = build_example_data(tmp_path / "data", limit=3)
    upload(server, big_jsonl_source(data), f"{unique_name}/docstrings")
    local = write_spec(tmp_path, unique_name, kafka_bootstrap, data)
    spec = object_store_spec(local, tmp_path, server, unique_name, unique_name)
    body = yaml.safe_load(spec.read_text())
    body["sources"] = [s for s in body["sources"] if s["name"] == "docstrings"]
    body["mixture"] = {"weights": {"docstrings": 1}}
    spec.write_text(yaml.safe_dump(body, sort_keys=False))
    extra = ("--unit-seconds", "0.005")
    loader = start_loader(spec, "docstrings", 0, tmp_path, *extra)
    growth = TopicGrowth(kafka_bootstrap, [JobTopics(unique_name).src("docstrings")])

    def running() -> bool:
        return loader.poll() is None

    growth.wait_for(500, running, 120)
    server.stop()
    wait_for_log(tmp_path, "trying again", running, 60)
    server.start()
    growth.wait_for(growth.records() + 500, running, 120)
    assert running(), "the loader finished before it could be killed mid-job"
    loader.send_signal(signal.SIGKILL)
    loader.wait(30)
    loader = start_loader(spec, "docstrings", 0, tmp_path, *extra)
    wait_all([loader], 240, tmp_path)
    ids = Counter(committed_sample_ids(kafka_bootstrap, JobTopics(unique_name), "docstrings"))
    assert ids == expected_sample_ids(load_spec(spec), kafka_bootstrap, "docstrings")
    assert set(ids.values()) == {1}, "a sample committed twice"
    assert sum(ids.values()) == 3 * 4_000


@pytest.mark.kafka
def test_an_object_changed_after_planning_is_a_dead_letter_and_the_job_goes_on(
    kafka_bootstrap: str, server: S3Server, tmp_path: Path, unique_name: str
) -> None:
    """The source is planned, then one of its objects is overwritten: its unit is one dead letter naming the
    object and the reason, every other unit's samples arrive once, and nothing of the new version does."""
    data = build_example_data(tmp_path / "data", limit=30)
    upload(server, data / "topics", f"{unique_name}/topics")
    spec = object_store_spec(
        write_spec(tmp_path, unique_name, kafka_bootstrap, data), tmp_path, server, unique_name, unique_name
    )
    job = load_spec(spec)
    config = {"bootstrap.servers": kafka_bootstrap}
    topics = JobTopics(unique_name)
    ensure_job_topics(config, unique_name, job.source_names, job.step.ranks)
    units = SourceRuntime.from_spec(job, "topics").plan(job.seed)
    publish_work_plan(config, topics, "topics", units, partition_count(config, topics.work("topics")))
    changed = units[0]
    key = f"{unique_name}/topics/{changed.path}"
    S3Storage("s3://corpus", server.settings()).client.put_object(Bucket="corpus", Key=key, Body=b"new version")
    wait_all([start_loader(spec, "topics", 0, tmp_path)], 240, tmp_path)
    [letter] = dead_letters(kafka_bootstrap, topics)
    assert letter.location == changed.path and f"s3://corpus/{key}: changed since planning" in letter.reason
    ids = Counter(committed_sample_ids(kafka_bootstrap, topics, "topics"))
    assert set(ids.values()) == {1} and len(ids) > 0
    assert not any(sample_id.startswith(f"topics/{changed.path}/") for sample_id in ids)


def test_a_loader_started_during_an_outage_waits_for_the_store_as_long_as_its_deadline(
    server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command reports an endpoint it never reached after a few seconds; a loader's storage waits for it as
    long as for one it lost, so a loader started while the store is away rides the outage out."""
    folder = tmp_path / "src"
    write_source(folder, "jsonl", [20])
    root = upload(server, folder, "late")
    body = {
        "job": "late",
        "tokenizer": "tok.json",
        "sources": [{"name": "web", "reader": "jsonl", "path": root, "pretokenized": False}],
        "mixture": {"weights": {"web": 1}},
        "step": {"ranks": 1, "micro_batches": 1, "tokens_per_micro_batch": 1024},
        "cost": {"alpha": 1.0, "beta": 10.0},
        "storage": storage_section(server, retry_deadline_s=60),
    }
    monkeypatch.setenv("MIXFLOW_TEST_S3_KEY", server.access_key)
    monkeypatch.setenv("MIXFLOW_TEST_S3_SECRET", server.secret_key)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    source = load_spec(path).sources[0]
    assert source_storage(source).settings.first_contact_s == FIRST_CONTACT_S  # type: ignore[attr-defined]
    storage = source_storage(source, patient=True)
    assert storage.settings.first_contact_s == 60  # type: ignore[attr-defined]
    seen = RetrySeen()
    logging.getLogger("connectors.storage.retry").addHandler(seen)
    server.stop()
    outcome: list[object] = []

    def probe() -> None:
        try:
            outcome.append(storage.probe())
        except Exception as exc:  # reported by the assertions below
            outcome.append(exc)

    probing = threading.Thread(target=probe)
    try:
        started = time.monotonic()
        probing.start()
        assert seen.event.wait(30), "the first request did not fail while the server was down"
        probing.join(max(0.0, started + FIRST_CONTACT_S + 2 - time.monotonic()))  # an outage past a command's wait
        assert probing.is_alive(), f"the loader's storage gave up on the store: {outcome}"
        server.start()
        probing.join(60)
    finally:
        logging.getLogger("connectors.storage.retry").removeHandler(seen)
    assert not probing.is_alive(), "the probe did not return within 60 s of the store coming back"
    assert outcome == [None]


def _client_error(status: int, code: str, message: str = "", operation: str = "GetObject") -> Exception:
    from botocore.exceptions import ClientError

    error = {"Code": code, "Message": message} if code else {}
    return ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}, operation)


STORE_ANSWERS = [
    (404, "NoSuchKey", ObjectMissingError),
    (404, "", ObjectMissingError),  # a HEAD's 404 has no body
    (404, "404", ObjectMissingError),
    (404, "NoSuchBucket", StorageNotFoundError),
    (404, "XAdminUserNotFound", StorageAccessError),  # versitygw's answer to an unknown access key
    (404, "NoSuchUser", StorageAccessError),
    (403, "AccessDenied", StorageAccessError),
    (403, "InvalidAccessKeyId", StorageAccessError),
    (403, "SignatureDoesNotMatch", StorageAccessError),
    (400, "ExpiredToken", StorageAccessError),
    (403, "403", StorageAccessError),
    (403, "", StorageAccessError),
    (412, "PreconditionFailed", ObjectChangedError),
    (503, "SlowDown", TransientError),
    (500, "InternalError", TransientError),
    (429, "", TransientError),
    (400, "InvalidBucketName", StorageError),
]
"""(HTTP status, error code, what it is): every answer a store may give that ``classify`` tells apart."""


@pytest.mark.parametrize(("status", "code", "kind"), STORE_ANSWERS)
def test_every_storage_answer_is_classified_by_what_it_means(status: int, code: str, kind: type) -> None:
    known = classify(_client_error(status, code, "the server's words"), "s3://b/k", "http://store")
    assert type(known) is kind, known
    if kind is StorageAccessError:
        assert known.exit_code == 5 and "s3://b/k" in str(known) and (code or str(status)) in str(known)
        assert not isinstance(known, OSError)  # a reader turns OSErrors into dead letters; never this one


def _stubbed(storage: S3Storage, *answers: tuple[str, object]) -> Stubber:
    stubber = Stubber(storage.client)
    for operation, answer in answers:
        if isinstance(answer, tuple):
            status, code = answer
            stubber.add_client_error(operation, service_error_code=code, http_status_code=status)
        else:
            stubber.add_response(operation, answer)
    stubber.activate()
    return stubber


@pytest.mark.parametrize(
    ("listing", "kind"),
    [
        ({"Contents": [], "KeyCount": 0}, ObjectMissingError),  # the listing confirms: gone
        ((404, "XAdminUserNotFound"), StorageAccessError),  # the credentials, not the object
        ((403, "InvalidAccessKeyId"), StorageAccessError),
        ((404, "NoSuchKey"), StorageAccessError),
    ],
)
def test_a_404_for_an_object_is_a_missing_object_only_once_a_listing_confirms_it(listing: object, kind: type) -> None:
    storage = S3Storage(
        "s3://bkt/prefix",
        S3Settings(endpoint_url="http://store.invalid", region="us-east-1", access_key_id="k", secret_access_key="s"),
    )
    _stubbed(storage, ("head_object", (404, "")), ("list_objects_v2", listing))
    with pytest.raises(kind) as info:
        storage.info("part-0.jsonl")
    assert "s3://bkt/prefix/part-0.jsonl" in str(info.value)


def test_a_404_for_a_key_the_listing_shows_is_asked_again() -> None:
    storage = S3Storage(
        "s3://bkt",
        S3Settings(
            endpoint_url="http://store.invalid",
            region="us-east-1",
            access_key_id="k",
            secret_access_key="s",
            retry=replace(STORAGE_RETRY, deadline_s=30, backoff_s=0.01),
        ),
    )
    shown = {"Contents": [{"Key": "x", "Size": 3, "ETag": '"e"'}], "KeyCount": 1}
    head = {"ContentLength": 3, "ETag": '"e"'}
    _stubbed(storage, ("head_object", (404, "")), ("list_objects_v2", shown), ("head_object", head))
    assert storage.info("x").size == 3


@pytest.mark.kafka
def test_a_storage_key_revoked_mid_run_stops_the_loader_with_the_reason_and_loses_nothing(
    kafka_bootstrap: str, server: S3Server, tmp_path: Path, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job reads the bucket with a user's key; the store removes the user mid-run: the loader stops within
    seconds with the store's refusal (exit 5), no unit becomes a dead letter, and once the key is back a new
    loader finishes the source with every sample exactly once."""
    data = build_example_data(tmp_path / "data", limit=3)
    upload(server, big_jsonl_source(data), f"{unique_name}/docstrings")
    spec = object_store_spec(
        write_spec(tmp_path, unique_name, kafka_bootstrap, data), tmp_path, server, unique_name, unique_name
    )
    body = yaml.safe_load(spec.read_text())
    body["sources"] = [s for s in body["sources"] if s["name"] == "docstrings"]
    body["mixture"] = {"weights": {"docstrings": 1}}
    spec.write_text(yaml.safe_dump(body, sort_keys=False))
    user, secret = f"job-{unique_name[:8]}", "a-user-secret-of-the-job"
    server.store.add_user(user, secret)
    monkeypatch.setenv("MIXFLOW_TEST_S3_KEY", user)
    monkeypatch.setenv("MIXFLOW_TEST_S3_SECRET", secret)
    loader = start_loader(spec, "docstrings", 0, tmp_path, "--unit-seconds", "0.005")
    growth = TopicGrowth(kafka_bootstrap, [JobTopics(unique_name).src("docstrings")])
    growth.wait_for(300, lambda: loader.poll() is None, 120)
    server.store.remove_user(user)
    revoked = time.monotonic()
    with pytest.raises(StorageAccessError):  # the store refuses the key from now on
        S3Storage("s3://corpus", server.settings(access_key_id=user, secret_access_key=secret)).probe()
    assert loader.wait(60) == 5
    assert time.monotonic() - revoked < 30
    last = (tmp_path / "loader-docstrings-0.log").read_text().strip().splitlines()[-1]
    assert last.startswith("mixflow load: error: s3://corpus/"), last
    assert "access denied (403 InvalidAccessKeyId" in last, last
    assert dead_letters(kafka_bootstrap, JobTopics(unique_name)) == []
    server.store.add_user(user, secret)
    wait_all([start_loader(spec, "docstrings", 0, tmp_path)], 240, tmp_path)
    ids = Counter(committed_sample_ids(kafka_bootstrap, JobTopics(unique_name), "docstrings"))
    assert ids == expected_sample_ids(load_spec(spec), kafka_bootstrap, "docstrings")
    assert set(ids.values()) == {1}
