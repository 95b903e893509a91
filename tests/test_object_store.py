"""The local object store (Versity S3 Gateway, ``pipeline/tools/stack/object_store.py``) over real HTTP:
objects and range reads, its lifecycle, its credentials files, and the faults chaos makes (restart, pause)."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError
from hypothesis import given
from hypothesis import strategies as st

from pipeline.tools.stack.object_store import LocalObjectStore
from tests.object_store import ObjectStoreEndpoint, running_object_store

WAIT_S = 60.0


@pytest.fixture
def private_store(tmp_path: Path) -> Iterator[ObjectStoreEndpoint]:
    """A store of the test's own, for the tests that stop, restart or pause it."""
    with running_object_store(tmp_path / "store") as endpoint:
        yield endpoint


@given(body=st.binary(min_size=1, max_size=4096), data=st.data())
def test_objects_round_trip_with_md5_etags_and_range_reads(
    object_store: ObjectStoreEndpoint, body: bytes, data
) -> None:
    client = object_store.client()
    bucket = object_store.bucket("roundtrip")
    put = client.put_object(Bucket=bucket, Key="dir/one.bin", Body=body)
    assert put["ETag"].strip('"') == hashlib.md5(body).hexdigest()
    start = data.draw(st.integers(0, len(body) - 1), label="start")
    end = data.draw(st.integers(start, len(body) - 1), label="end")
    ranged = client.get_object(Bucket=bucket, Key="dir/one.bin", Range=f"bytes={start}-{end}")
    assert ranged["Body"].read() == body[start : end + 1]
    assert ranged["ContentRange"] == f"bytes {start}-{end}/{len(body)}"


def test_listing_paginates_over_a_prefix(object_store: ObjectStoreEndpoint) -> None:
    client = object_store.client()
    bucket = object_store.bucket("listing")
    keys = [f"part/{index:03d}.jsonl" for index in range(7)]
    for key in keys:
        client.put_object(Bucket=bucket, Key=key, Body=key.encode())
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix="part/", PaginationConfig={"PageSize": 3}
    )
    listed = [item["Key"] for page in pages for item in page.get("Contents", [])]
    assert listed == keys


def test_wrong_keys_are_refused(object_store: ObjectStoreEndpoint) -> None:
    import boto3

    options = {**object_store.client_options(), "aws_secret_access_key": "not-the-secret"}
    client = boto3.client("s3", **options)
    with pytest.raises(client.exceptions.ClientError) as refused:
        client.list_buckets()
    assert refused.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_credentials_files_are_owner_only_and_the_keys_stay_off_the_command_line(
    private_store: ObjectStoreEndpoint,
) -> None:
    store = private_store.store
    for path in (private_store.credentials_file, private_store.env_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    env = dict(line.split("=", 1) for line in private_store.env_file.read_text().splitlines())
    assert env["AWS_ACCESS_KEY_ID"] == private_store.access_key
    assert env["AWS_ENDPOINT_URL"] == private_store.endpoint_url
    pid = store.running_pid()
    assert pid is not None
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert private_store.secret_key.encode() not in cmdline
    assert private_store.access_key.encode() not in cmdline
    assert private_store.secret_key not in store.status().describe()


def test_start_is_idempotent_and_restart_keeps_data_keys_and_port(private_store: ObjectStoreEndpoint) -> None:
    store = private_store.store
    pid = store.running_pid()
    assert store.start() == private_store.endpoint_url
    assert store.running_pid() == pid
    client = private_store.client()
    bucket = private_store.bucket("kept")
    client.put_object(Bucket=bucket, Key="a.txt", Body=b"kept")

    again = LocalObjectStore(store.state_dir)  # as a later command would find it: port from server.json
    assert again.restart() == private_store.endpoint_url
    assert again.running_pid() not in (None, pid)
    assert again.credentials() == store.credentials()
    assert client.get_object(Bucket=bucket, Key="a.txt")["Body"].read() == b"kept"


def test_stop_and_kill_end_the_server(private_store: ObjectStoreEndpoint) -> None:
    store = private_store.store
    assert store.stop()
    assert not store.status().running
    assert not store.stop()
    store.start()
    assert store.status().answering
    assert store.kill()
    assert store.status().describe().startswith("not running")


def _retry_signal(client: Any, operation: str) -> threading.Event:
    """An event set when ``operation`` on ``client`` first fails with a connection error or timeout and
    botocore is about to retry it."""
    failed = threading.Event()

    def on_needs_retry(caught_exception: Exception | None = None, **_: Any) -> None:
        if caught_exception is not None:
            failed.set()

    client.meta.events.register(f"needs-retry.s3.{operation}", on_needs_retry)
    return failed


def _in_thread(call: Any) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = call()
        except Exception as exc:  # reported by the test's assertion
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_client_retries_through_a_restart(private_store: ObjectStoreEndpoint) -> None:
    store = private_store.store
    bucket = private_store.bucket("restart")
    private_store.client().put_object(Bucket=bucket, Key="k", Body=b"after the restart")
    client = private_store.client(retries={"mode": "standard", "total_max_attempts": 30}, connect_timeout=2)
    failed = _retry_signal(client, "GetObject")
    store.stop()
    thread, outcome = _in_thread(lambda: client.get_object(Bucket=bucket, Key="k"))
    assert failed.wait(WAIT_S), "the client never saw the stopped server"
    store.start()
    thread.join(WAIT_S)
    assert "result" in outcome, outcome.get("error", "the request did not finish after the restart")
    assert outcome["result"]["Body"].read() == b"after the restart"
    assert outcome["result"]["ResponseMetadata"]["RetryAttempts"] >= 1


def test_a_paused_server_times_requests_out_until_it_resumes(private_store: ObjectStoreEndpoint) -> None:
    store = private_store.store
    bucket = private_store.bucket("pause")
    private_store.client().put_object(Bucket=bucket, Key="k", Body=b"after the stall")
    single = private_store.client(retries={"total_max_attempts": 1}, connect_timeout=1, read_timeout=1)
    store.pause()
    try:
        assert store.status().paused
        with pytest.raises((ReadTimeoutError, ConnectTimeoutError, EndpointConnectionError)):
            single.get_object(Bucket=bucket, Key="k")
        patient = private_store.client(
            retries={"mode": "standard", "total_max_attempts": 30}, connect_timeout=1, read_timeout=1
        )
        failed = _retry_signal(patient, "GetObject")
        thread, outcome = _in_thread(lambda: patient.get_object(Bucket=bucket, Key="k"))
        assert failed.wait(WAIT_S), "the request never timed out on the paused server"
    finally:
        store.resume()
    thread.join(WAIT_S)
    assert "result" in outcome, outcome.get("error", "the request did not finish after the resume")
    assert outcome["result"]["Body"].read() == b"after the stall"
    assert single.get_object(Bucket=bucket, Key="k")["Body"].read() == b"after the stall"


def test_without_extended_attributes_the_metadata_goes_to_a_sidecar_folder(tmp_path: Path) -> None:
    # Where the filesystem has them, the server is started as on any other; the sidecar variant is started
    # here by hand, to check that versitygw takes it as `mixflow` passes it.
    from pipeline.tools.stack.local_broker import free_port_block
    from pipeline.tools.stack.object_store import server_answers, server_command, supports_xattrs
    from pipeline.tools.stack.object_store_install import ensure_installed

    assert supports_xattrs(tmp_path) and not list(tmp_path.iterdir()), "the probe file must not stay behind"
    (tmp_path / "data" / "bucket").mkdir(parents=True)
    (tmp_path / "metadata").mkdir()
    port = free_port_block(1)
    command = server_command(ensure_installed(), f"127.0.0.1:{port}", tmp_path / "data", tmp_path / "metadata")
    assert command[-4:] == ["posix", "--sidecar", str(tmp_path / "metadata"), str(tmp_path / "data")]
    keys = {"ROOT_ACCESS_KEY_ID": "sidecar", "ROOT_SECRET_ACCESS_KEY": "sidecar-secret"}
    process = subprocess.Popen(
        command, env={**os.environ, **keys}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not server_answers("127.0.0.1", port, timeout_s=1.0):
            assert process.poll() is None and time.monotonic() < deadline, "versitygw --sidecar did not start"
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-east-1",
            aws_access_key_id="sidecar",
            aws_secret_access_key="sidecar-secret",
        )
        put = client.put_object(Bucket="bucket", Key="k", Body=b"sidecar", Metadata={"who": "me"})
        head = client.head_object(Bucket="bucket", Key="k")
        assert head["ETag"] == put["ETag"] and head["Metadata"] == {"who": "me"}
        assert any((tmp_path / "metadata").rglob("*")), "nothing was written to the sidecar folder"
    finally:
        process.terminate()
        process.wait(WAIT_S)


def test_without_go_and_without_a_cached_build_the_error_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.tools.stack.object_store_install import BINARY_ENV, ensure_installed, installed_path
    from topics.errors import MixflowError

    monkeypatch.delenv(BINARY_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(MixflowError, match="'go' is not on PATH; it is needed once to build the local object store"):
        ensure_installed(tmp_path / "cache")
    built = installed_path(tmp_path / "cache")
    built.parent.mkdir(parents=True)
    built.write_text("#!/bin/sh\n")
    built.chmod(0o755)
    assert ensure_installed(tmp_path / "cache") == built, "a cached build is used without go"
    monkeypatch.setenv(BINARY_ENV, str(tmp_path / "nothing"))
    with pytest.raises(MixflowError, match="not an executable file"):
        ensure_installed(tmp_path / "cache")
