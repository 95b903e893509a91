"""A real S3 server for the storage tests: versitygw over a folder (each bucket a subfolder), on a free port,
started and stopped by the test; plus the settings that reach it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from connectors.storage import RetryPolicy
from connectors.storage.s3 import S3Settings

ACCESS_KEY = "mixflowtest"
SECRET_KEY = "mixflowtestsecret"
BUCKET = "corpus"
_BINARIES = (os.environ.get("MIXFLOW_VERSITYGW", ""), str(Path.home() / ".cache/mixflow/bin-probe/versitygw"))
START_TIMEOUT_S = 30.0


def versitygw_binary() -> str | None:
    """``$MIXFLOW_VERSITYGW``, else the project's build (``mixflow stack`` installs it into its cache), else
    one on the PATH."""
    from pipeline.tools.stack.object_store_install import installed_path

    candidates = (*_BINARIES[:1], str(installed_path()), *_BINARIES[1:])
    return next((b for b in candidates if b and Path(b).is_file()), None) or shutil.which("versitygw")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class S3Server:
    """versitygw serving ``root`` at ``127.0.0.1:port``; :meth:`stop` and :meth:`start` make an outage."""

    def __init__(self, binary: str, root: Path, port: int) -> None:
        self.binary = binary
        self.root = root
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [self.binary, "--access", ACCESS_KEY, "--secret", SECRET_KEY, "--port", f"127.0.0.1:{self.port}"]
        self.process = subprocess.Popen(
            [*command, "posix", str(self.root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"versitygw did not listen on {self.port} within {START_TIMEOUT_S} s")
            time.sleep(0.05)  # polling a port that has no event to wait on

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None

    def settings(self, **changes: object) -> S3Settings:
        values: dict[str, object] = {
            "endpoint_url": self.endpoint,
            "region": "us-east-1",
            "addressing_style": "path",
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
            "retry": RetryPolicy(deadline_s=20.0),
        }
        values.update(changes)
        return S3Settings(**values)  # type: ignore[arg-type]

    def bucket(self, name: str = BUCKET) -> Path:
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        return folder


@contextmanager
def running_server(root: Path) -> Iterator[S3Server]:
    binary = versitygw_binary()
    if binary is None:
        pytest.skip("no versitygw binary (set MIXFLOW_VERSITYGW)")
    root.mkdir(parents=True, exist_ok=True)
    server = S3Server(binary, root, free_port())
    server.start()
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
