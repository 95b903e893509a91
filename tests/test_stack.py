"""`mixflow stack up|status|down` on its own state folder and ports, beside the session's broker."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from pipeline.tools.stack.local_broker import LocalBroker, free_port_pair
from topics.kafka.admin import ensure_job_topics

MIXFLOW = [sys.executable, "-m", "pipeline.cli"]


def _mixflow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MIXFLOW, *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.kafka  # starts a broker of its own (not the session's), so not part of the pure suite
def test_up_is_idempotent_and_down_stops_the_broker(tmp_path: Path) -> None:
    state = tmp_path / "state"
    port = free_port_pair()
    first = _mixflow("stack", "up", "--state-dir", str(state), "--port", str(port))
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().splitlines()[-1] == f"127.0.0.1:{port}"
    pid = json.loads((state / "broker.json").read_text())["pid"]
    try:
        second = _mixflow("stack", "up", "--state-dir", str(state), "--port", str(port))
        assert second.returncode == 0, second.stderr
        assert second.stdout.strip().splitlines()[-1] == f"127.0.0.1:{port}"
        assert json.loads((state / "broker.json").read_text())["pid"] == pid, "a second broker was started"

        status = _mixflow("stack", "status", "--state-dir", str(state))
        assert status.returncode == 0
        assert f"pid {pid}" in status.stdout and "answering" in status.stdout

        with _a_running_job(f"127.0.0.1:{port}") as (job, group):
            refused = _mixflow("stack", "down", "--state-dir", str(state))
            assert refused.returncode == 5, refused.stdout + refused.stderr
            assert f"jobs run against the stack at 127.0.0.1:{port}: {job} (groups {group})" in refused.stderr
            assert "--force" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
            assert json.loads((state / "broker.json").read_text())["pid"] == pid and _is_kafka(pid), "it stopped"
    finally:
        down = _mixflow("stack", "down", "--force", "--state-dir", str(state))
    assert down.returncode == 0 and "stopped" in down.stdout
    assert not _is_kafka(pid)
    assert _mixflow("stack", "status", "--state-dir", str(state)).returncode == 1
    assert "no broker of ours" in _mixflow("stack", "down", "--state-dir", str(state)).stdout

    stranger = tmp_path / "not-a-stack"
    stranger.mkdir()
    (stranger / "keep.txt").write_text("mine")
    refused = _mixflow("stack", "down", "--wipe", "--state-dir", str(stranger))
    assert refused.returncode != 0 and "not deleting it" in refused.stderr and (stranger / "keep.txt").exists()
    store = state / "object-store"
    (store / "data" / "a-bucket").mkdir(parents=True)
    (store / "credentials").write_text("[default]\n")
    wiped = _mixflow("stack", "down", "--wipe", "--state-dir", str(state))
    assert wiped.returncode == 0, wiped.stderr
    kept = f"kept the object store's buckets and keys in {store} (--wipe-object-store deletes them)"
    assert f"wiped {state}: the broker's topics, consumer groups, logs, config and secrets; {kept}" in wiped.stdout
    assert sorted(path.name for path in state.iterdir()) == ["object-store"] and (store / "data" / "a-bucket").is_dir()
    buckets = _mixflow("stack", "down", "--wipe-object-store", "--state-dir", str(state))
    assert buckets.returncode == 0 and f"wiped {store}: the object store's buckets, objects and keys" in buckets.stdout
    assert not store.exists()


def _is_kafka(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and b"kafka.Kafka" in Path(f"/proc/{pid}/cmdline").read_bytes()


@contextlib.contextmanager
def _a_running_job(bootstrap: str) -> Iterator[tuple[str, str]]:
    """A job as the broker sees one run: its topics, and a member in its constructor's lease group."""
    job = f"t{uuid.uuid4().hex[:8]}-running"
    ensure_job_topics(bootstrap, job, ["web"], 1)
    group = f"{job}.constructor.lease"
    assigned = threading.Event()
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": 6000})
    member.subscribe([f"{job}.control"], on_assign=lambda *_: assigned.set())
    deadline = time.monotonic() + 60
    while not assigned.is_set():
        assert time.monotonic() < deadline, f"no member joined {group} within 60 s"
        member.poll(0.1)
    try:
        yield job, group
    finally:
        member.close()


def test_up_refuses_a_port_another_process_holds(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = _mixflow("stack", "up", "--state-dir", str(tmp_path), "--port", str(port))
    assert result.returncode == 2
    assert f"127.0.0.1:{port} is taken by another process" in result.stderr
    assert LocalBroker(tmp_path).status().running is False
