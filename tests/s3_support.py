"""A real S3 server for the storage tests: the project's ``LocalObjectStore`` (versitygw over a folder, each
bucket a subfolder) in the test's own folder on a free port, started and stopped by the test; plus the
settings that reach it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from connectors.storage import STORAGE_RETRY
from connectors.storage.s3 import S3Settings
from pipeline.tools.stack.local_broker import free_port_block
from pipeline.tools.stack.object_store import REGION, LocalObjectStore

BUCKET = "corpus"


class S3Server:
    """A ``LocalObjectStore`` under ``state_dir``; :meth:`stop` and :meth:`start` make an outage."""

    def __init__(self, state_dir: Path, port: int) -> None:
        self.store = LocalObjectStore(state_dir, port=port)
        self.port = port
        credentials = self.store.credentials()
        self.access_key, self.secret_key = credentials.access_key, credentials.secret_key

    @property
    def root(self) -> Path:
        """The folder the server serves: one subfolder per bucket, one file per object."""
        return self.store.data_dir

    @property
    def endpoint(self) -> str:
        return self.store.endpoint

    def start(self) -> None:
        self.store.start()

    def stop(self) -> None:
        self.store.stop()

    def settings(self, **changes: object) -> S3Settings:
        values: dict[str, object] = {
            "endpoint_url": self.endpoint,
            "region": REGION,
            "addressing_style": "path",
            "access_key_id": self.access_key,
            "secret_access_key": self.secret_key,
            "retry": replace(STORAGE_RETRY, deadline_s=20.0),
        }
        values.update(changes)
        return S3Settings(**values)  # type: ignore[arg-type]

    def bucket(self, name: str = BUCKET) -> Path:
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        return folder


@contextmanager
def running_server(state_dir: Path) -> Iterator[S3Server]:
    """A server of its own in ``state_dir`` (port below the ephemeral range, so a restart finds it free)."""
    from topics.errors import MixflowError

    server = S3Server(state_dir, free_port_block(1))
    try:
        server.start()
    except MixflowError as exc:  # no versitygw and no Go to build it
        pytest.skip(f"no object store: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_server(tmp_path: Path) -> Iterator[S3Server]:
    with running_server(tmp_path / "s3") as server:
        yield server


def upload(server: S3Server, folder: Path, prefix: str, bucket: str = BUCKET) -> str:
    """Put every file under ``folder`` into ``bucket`` under ``prefix`` through S3 (so each object has its
    ETag), the bucket made when missing; the source root ``s3://bucket/prefix``."""
    from connectors.storage.s3 import S3Storage

    client = S3Storage(f"s3://{bucket}", server.settings()).client
    if not (server.root / bucket).is_dir():
        client.create_bucket(Bucket=bucket)
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        client.put_object(Bucket=bucket, Key=f"{prefix}/{file.relative_to(folder).as_posix()}", Body=file.read_bytes())
    return f"s3://{bucket}/{prefix}"


def storage_section(server: S3Server, retry_deadline_s: float) -> dict:
    """A spec's ``storage`` section reaching ``server``, its keys named by the environment variables
    ``MIXFLOW_TEST_S3_KEY`` and ``MIXFLOW_TEST_S3_SECRET`` (the caller sets them)."""
    return {
        "endpoint_url": server.endpoint,
        "region": REGION,
        "addressing_style": "path",
        "credentials": {
            "access_key_id": {"env": "MIXFLOW_TEST_S3_KEY"},
            "secret_access_key": {"env": "MIXFLOW_TEST_S3_SECRET"},
        },
        "retry_deadline_s": retry_deadline_s,
    }
