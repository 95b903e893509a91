"""Run a whole job on this machine: every source's loaders and the constructor as processes, then report.

The processes are the same ``mixflow load`` and ``mixflow construct`` a cluster deployment runs, so a
local run exercises exactly the production path; only the process supervision here is local.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.spec import JobSpec, load_spec
from topics.errors import MixflowError

log = logging.getLogger(__name__)

# A role exits with this code when its Kafka client is stuck (KafkaClientStuckError): a new process
# fences the old one's transactions and takes over, so the supervisor restarts it.
STUCK_EXIT_CODE = 3
MAX_RESTARTS = 3


@dataclass
class RoleProcess:
    name: str
    process: subprocess.Popen
    log_file: Path

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


def run_local_job(spec_path: Path, bootstrap: str | None, folder: Path) -> list[RoleProcess]:
    """Start every role of the job, wait for all of them, and return them; a role that fails stops
    the others and raises a MixflowError holding the end of its log."""
    spec = load_spec(spec_path)
    folder.mkdir(parents=True, exist_ok=True)
    common = ["--spec", str(spec_path), *(["--bootstrap-servers", bootstrap] if bootstrap else [])]
    roles = []
    for source in spec.sources:
        for i in range(source.loaders):
            load = ["load", *common, "--source", source.name, "--instance", str(i), "--until-drained"]
            roles.append(_start(f"load-{source.name}-{i}", folder, load))
    roles.append(_start("construct", folder, ["construct", *common]))
    try:
        _wait(roles)
    except BaseException:
        for role in roles:
            if role.process.poll() is None:
                role.process.terminate()
        for role in roles:
            role.process.wait(timeout=60)
        raise
    return roles


def _start(name: str, folder: Path, args: list[str]) -> RoleProcess:
    log_file = folder / f"{name}.log"
    with log_file.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "pipeline.cli", *args], stdout=out, stderr=subprocess.STDOUT)
    log.info("started %s (pid %d), log %s", name, process.pid, log_file)
    return RoleProcess(name, process, log_file)


def _wait(roles: list[RoleProcess]) -> None:
    running = list(roles)
    restarts = 0
    while running:
        for role in list(running):
            code = role.process.poll()
            if code is None:
                continue
            if code == STUCK_EXIT_CODE and restarts < MAX_RESTARTS:
                restarts += 1
                log.warning("%s exited with a stuck Kafka client; restarting it (%d/%d)", role.name, restarts,
                            MAX_RESTARTS)  # fmt: skip
                with role.log_file.open("ab") as out:
                    role.process = subprocess.Popen(role.process.args, stdout=out, stderr=subprocess.STDOUT)
                continue
            running.remove(role)
            if code != 0:
                msg = f"{role.name} exited with {code}; the end of {role.log_file}:\n{role.tail()}"
                raise MixflowError(msg)
            log.info("%s finished: %s", role.name, role.summary())
        time.sleep(0.2)  # supervising child processes: nothing to wait on but their exit
