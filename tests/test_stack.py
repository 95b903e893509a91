"""`mixflow stack up|status|down` on its own state folder and ports, beside the session's broker."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.tools.stack.local_broker import LocalBroker, free_port_pair

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
    finally:
        down = _mixflow("stack", "down", "--state-dir", str(state))
    assert down.returncode == 0 and "stopped" in down.stdout
    assert not Path(f"/proc/{pid}").exists() or b"kafka.Kafka" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert _mixflow("stack", "status", "--state-dir", str(state)).returncode == 1
    assert "no broker of ours" in _mixflow("stack", "down", "--state-dir", str(state)).stdout

    stranger = tmp_path / "not-a-stack"
    stranger.mkdir()
    (stranger / "keep.txt").write_text("mine")
    refused = _mixflow("stack", "down", "--wipe", "--state-dir", str(stranger))
    assert refused.returncode != 0 and "not deleting it" in refused.stderr and (stranger / "keep.txt").exists()
    wiped = _mixflow("stack", "down", "--wipe", "--state-dir", str(state))
    assert wiped.returncode == 0 and f"wiped {state}" in wiped.stdout and not state.exists()


def test_up_refuses_a_port_another_process_holds(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = _mixflow("stack", "up", "--state-dir", str(tmp_path), "--port", str(port))
    assert result.returncode == 2
    assert f"127.0.0.1:{port} is taken by another process" in result.stderr
    assert LocalBroker(tmp_path).status().running is False
