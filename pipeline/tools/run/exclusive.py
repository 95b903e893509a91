"""One `mixflow run` of a job at a time. A second run of a job that is running is refused, found two ways:

* on any machine, by the broker: the job's consumer groups (its loaders' work groups, its constructors' lease)
  have members. A role killed without closing stays a member until its session times out (45 s for a loader,
  about a second for a constructor), so a run started right after another was killed may be refused briefly.
* on this machine, by an exclusive ``flock`` on ``<job folder>/run.lock`` that a run holds while it lasts: it
  covers the moment before the roles have joined their groups. The kernel drops the lock when the process ends,
  however it ends; the file stays, naming the last run that held it.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from topics.errors import RefusedError
from topics.kafka.group_admin import job_groups

LOCK_FILE = "run.lock"


def refuse_if_running(config: Mapping[str, Any], job: str) -> None:
    """``RefusedError`` naming the job's consumer groups that have members now (its roles are running)."""
    running = {group: members for group, members in job_groups(config, job).items() if members}
    if running:
        listed = ", ".join(
            f"{group} ({members} member{'s' if members != 1 else ''})" for group, members in running.items()
        )
        msg = (
            f"job {job} is running at {config['bootstrap.servers']}: its consumer groups have members ({listed}); "
            "stop its roles or wait for them to end (a role killed just now stays a member until its session times "
            "out, up to 45 s)"
        )
        raise RefusedError(msg)


class RunLock:
    """The exclusive lock of a run on its job folder; ``acquire`` refuses when another run holds it."""

    def __init__(self, folder: Path, job: str) -> None:
        self.path = folder / LOCK_FILE
        self.job = job
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 512).decode(errors="replace").strip() or "another run"
            os.close(fd)
            msg = (
                f"job {self.job} is running on this machine: {holder} holds {self.path} (a second run would replace "
                "its logs); wait for it to end or stop it"
            )
            raise RefusedError(msg) from None
        os.ftruncate(fd, 0)
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        os.write(fd, f"mixflow run (pid {os.getpid()} on {socket.gethostname()}, since {started})\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the lock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *_: object) -> None:
        self.release()
