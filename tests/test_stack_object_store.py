"""`mixflow stack up --object-store`, `stack down|status` with it, and `mixflow stack object-store ...` alone, on
folders and ports of their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from pipeline.tools.stack.local_broker import free_port_block, free_port_pair
from pipeline.tools.stack.object_store import LocalObjectStore

MIXFLOW = [sys.executable, "-m", "pipeline.cli"]


def _mixflow(*args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "MIXFLOW_OBJECT_STORE_DIR"}
    return subprocess.run([*MIXFLOW, *args], capture_output=True, text=True, timeout=180, check=False, env=env)


def _client_from_env_file(env_file: Path) -> object:
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name=env["AWS_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )


@pytest.mark.kafka  # starts a broker of its own (not the session's)
@pytest.mark.object_store
def test_stack_up_with_the_object_store_and_down_stops_both(tmp_path: Path) -> None:
    state = tmp_path / "state"
    port, store_port = free_port_pair(), free_port_block(1)
    common = ("--state-dir", str(state))
    up = _mixflow("stack", "up", *common, "--port", str(port), "--object-store", "--object-store-port", str(store_port))
    try:
        assert up.returncode == 0, up.stderr
        lines = up.stdout.strip().splitlines()
        assert lines[-1] == f"127.0.0.1:{port}"
        store_dir = state / "object-store"
        assert f"object store: http://127.0.0.1:{store_port}; credentials {store_dir / 'credentials'}" in up.stdout
        secret = LocalObjectStore(store_dir).credentials().secret_key
        assert secret not in up.stdout

        status = _mixflow("stack", "status", *common)
        assert status.returncode == 0, status.stdout + status.stderr
        assert (
            f"object store: running, pid {json.loads((store_dir / 'server.json').read_text())['pid']}" in status.stdout
        )
        assert secret not in status.stdout
        _client_from_env_file(store_dir / "env").create_bucket(Bucket="from-the-env-file")
    finally:
        down = _mixflow("stack", "down", *common)
    assert down.returncode == 0 and "object store stopped" in down.stdout, down.stdout + down.stderr
    assert not LocalObjectStore(state / "object-store").status().running
    assert (state / "object-store" / "data" / "from-the-env-file").is_dir()


@pytest.mark.object_store
def test_object_store_commands_alone(tmp_path: Path) -> None:
    folder = ("--state-dir", str(tmp_path / "store"))
    up = _mixflow("stack", "object-store", "up", *folder, "--port", str(free_port_block(1)))
    try:
        assert up.returncode == 0, up.stderr
        store = LocalObjectStore(tmp_path / "store")
        pid = store.running_pid()
        assert _mixflow("stack", "object-store", "status", *folder).returncode == 0

        paused = _mixflow("stack", "object-store", "pause", *folder)
        assert paused.returncode == 0 and store.status().paused
        still = _mixflow("stack", "object-store", "status", *folder)
        assert still.returncode == 1 and "paused (SIGSTOP)" in still.stdout
        assert _mixflow("stack", "object-store", "resume", *folder).returncode == 0
        assert store.status().answering

        restarted = _mixflow("stack", "object-store", "restart", *folder, "--kill")
        assert restarted.returncode == 0 and f"restarted: {store.endpoint}" in restarted.stdout, (
            restarted.stderr + subprocess.run(["ss", "-tanp"], capture_output=True, text=True).stdout
        )
        assert store.running_pid() not in (None, pid)
    finally:
        down = _mixflow("stack", "object-store", "down", *folder)
    assert down.returncode == 0 and "object store stopped" in down.stdout
    status = _mixflow("stack", "object-store", "status", *folder)
    assert status.returncode == 1 and "not running" in status.stdout
