"""Run a whole job on this machine: every source's loaders, the constructor and optionally a training
command as processes, then report.

The processes are the same ``mixflow load`` and ``mixflow construct`` a cluster deployment runs, so a
local run exercises exactly the production path; only the process supervision here is local.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.progress import JobProgress
from pipeline.spec import JobSpec, load_spec
from topics.errors import MixflowError

log = logging.getLogger(__name__)

# A role that dies (a stuck Kafka client exits with 3, a crash with anything else) is started again: the
# new process fences the old one's transactions and resumes from the committed offsets. Each role gets
# MAX_RESTARTS, spaced by a backoff that doubles from RESTART_BACKOFF_S.
MAX_RESTARTS = 3
RESTART_BACKOFF_S = 1.0


@dataclass
class RoleProcess:
    name: str
    process: subprocess.Popen
    log_file: Path
    env: dict[str, str] | None = None
    restarts: int = 0
    restart_at: float | None = None  # when a dead role is due to start again

    def summary(self) -> dict:
        lines = self.log_file.read_text(errors="replace").strip().splitlines()
        try:
            return json.loads(lines[-1]) if lines else {}
        except ValueError:
            return {}

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])


def job_spec_file(spec_path: Path, job: str | None, folder: Path) -> tuple[JobSpec, Path]:
    """The spec, with ``job`` renamed when given, written with absolute paths under ``folder``."""
    spec = load_spec(spec_path)
    if job is None:
        return spec, spec_path
    body = spec.model_dump(mode="json", exclude_none=True)
    body["job"] = job
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return load_spec(path), path


def run_local_job(
    spec_path: Path,
    bootstrap: str | None,
    folder: Path,
    trainer: list[str] | None = None,
    progress: JobProgress | None = None,
    shadows: int = 0,
) -> list[RoleProcess]:
    """Start every role of the job (and ``trainer``, a command, when given), wait for all of them, and
    return them; a role that fails stops the others and raises a MixflowError holding the end of its log.
    ``shadows`` more constructors wait to take over from the active one."""
    spec = load_spec(spec_path)
    folder.mkdir(parents=True, exist_ok=True)
    common = ["--spec", str(spec_path), *(["--bootstrap-servers", bootstrap] if bootstrap else [])]
    mixflow = [sys.executable, "-m", "pipeline.cli"]
    roles = []
    for source in spec.sources:
        for i in range(source.loaders):
            load = ["load", *common, "--source", source.name, "--instance", str(i), "--until-drained"]
            roles.append(_start(f"load-{source.name}-{i}", folder, [*mixflow, *load]))
    for i in range(1 + shadows):
        name = "construct" if i == 0 else f"construct-{i}"
        roles.append(_start(name, folder, [*mixflow, "construct", *common, "--instance", name]))
    if trainer:
        roles.append(_start("train", folder, trainer, {"KAFKA_BOOTSTRAP_SERVERS": bootstrap} if bootstrap else None))
    try:
        _wait(roles, progress)
    except BaseException:
        for role in roles:
            if role.process.poll() is None:
                role.process.terminate()
        for role in roles:
            try:
                role.process.wait(timeout=60)
            except subprocess.TimeoutExpired:  # a role that does not stop must not hide the error
                role.process.kill()
                role.process.wait()
        raise
    return roles


def trainer_command(template: str, spec_path: Path, out: Path) -> list[str]:
    """A training command line from ``template``, with ``{python}``, ``{spec}`` and ``{out}`` filled in."""
    fields = {"python": sys.executable, "spec": str(spec_path), "out": str(out)}
    try:
        return [word.format(**fields) for word in shlex.split(template)]
    except (KeyError, IndexError, ValueError) as exc:
        msg = f"bad --trainer command {template!r} ({exc}); it may use {{python}}, {{spec}} and {{out}}"
        raise MixflowError(msg) from exc


def _start(name: str, folder: Path, command: list[str], env: dict[str, str] | None = None) -> RoleProcess:
    log_file = folder / f"{name}.log"
    with log_file.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env} if env else None
        )
    log.info("started %s (pid %d), log %s", name, process.pid, log_file)
    return RoleProcess(name, process, log_file, env)


def _wait(roles: list[RoleProcess], progress: JobProgress | None) -> None:
    running = list(roles)
    while running:
        if progress is not None:
            progress.update([role.name for role in running])
        for role in list(running):
            if role.restart_at is not None:
                if time.monotonic() >= role.restart_at:
                    _restart(role)
                continue
            code = role.process.poll()
            if code is None:
                continue
            if code != 0 and role.restarts < MAX_RESTARTS:
                role.restarts += 1
                delay = RESTART_BACKOFF_S * 2 ** (role.restarts - 1)
                log.warning(
                    "%s exited with %d; starting it again in %.0f s (restart %d of %d); the end of its log:\n%s",
                    role.name,
                    code,
                    delay,
                    role.restarts,
                    MAX_RESTARTS,
                    role.tail(5),
                )
                role.restart_at = time.monotonic() + delay
                continue
            running.remove(role)
            if code != 0:
                msg = (
                    f"{role.name} exited with {code} after {role.restarts} restarts; "
                    f"the end of {role.log_file}:\n{role.tail()}"
                )
                raise MixflowError(msg)
            log.info("%s finished: %s", role.name, role.summary())
        time.sleep(0.2)  # supervising child processes: nothing to wait on but their exit


def _restart(role: RoleProcess) -> None:
    role.restart_at = None
    with role.log_file.open("ab") as out:
        env = {**os.environ, **role.env} if role.env else None
        role.process = subprocess.Popen(role.process.args, stdout=out, stderr=subprocess.STDOUT, env=env)
    log.info("restarted %s (pid %d)", role.name, role.process.pid)
