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
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml
from confluent_kafka import KafkaException

from pipeline.metrics import RunMetrics
from pipeline.roles.autoscale import Autoscaler, JobProbe, PolicySettings
from pipeline.spec import JobSpec, load_spec
from pipeline.tools.run.progress import JobProgress
from topics.errors import MixflowError, NotFoundError, RefusedError

log = logging.getLogger(__name__)

# A role that dies (a stuck Kafka client exits with 3, a crash with anything else) is started again: the
# new process fences the old one's transactions and resumes from the committed offsets. Each role gets
# MAX_RESTARTS, spaced by a backoff that doubles from RESTART_BACKOFF_S. One refused (exit 5: credentials or
# ACLs refused, an object changed since planning under `on_changed_object: stop`) or one that found what it
# needs missing (exit 4: no such bucket, topic or job) would fail the same way again: the job stops with its
# reason, said once.
MAX_RESTARTS = 3
RESTART_BACKOFF_S = 1.0
DECISIONS_FILE = "autoscale.jsonl"
# The roles run the same CLI a deployment runs, in this interpreter.
MIXFLOW = [sys.executable, "-m", "pipeline.cli"]


@dataclass
class RoleProcess:
    name: str
    process: subprocess.Popen
    log_file: Path
    env: dict[str, str] | None = None
    restarts: int = 0
    restart_at: float | None = None  # when a dead role is due to start again
    source: str | None = None  # a loader's source and instance number
    instance: int | None = None
    retiring: bool = False  # asked to stop by the autoscaler: its exit is neither a failure nor restarted

    def summary(self) -> dict:
        lines = self.log_file.read_text(errors="replace").strip().splitlines()
        try:
            return json.loads(lines[-1]) if lines else {}
        except ValueError:
            return {}

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])


def job_spec_file(spec_path: Path, job: str | None, folder: Path) -> tuple[JobSpec, Path]:
    """The spec, with ``job`` renamed when given, written with absolute paths under ``folder``. A field the
    spec sets to null stays null (``composition: null`` is the in-order draw, not the default)."""
    spec = load_spec(spec_path)
    if job is None:
        return spec, spec_path
    body = spec.model_dump(mode="json", exclude_unset=True)
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
    max_total_loaders: int | None = None,
    metrics: RunMetrics | None = None,
) -> list[RoleProcess]:
    """Start every role of the job (and ``trainer``, a command, when given), wait for all of them, and
    return them; a role that fails stops the others and raises a MixflowError holding the end of its log.
    ``shadows`` more constructors wait to take over from the active one, for each of the spec's lanes."""
    spec = load_spec(spec_path)
    folder.mkdir(parents=True, exist_ok=True)
    common = ["--spec", str(spec_path), *(["--bootstrap-servers", bootstrap] if bootstrap else [])]
    roles: list[RoleProcess] = []
    metrics = metrics or RunMetrics(folder, spec.job, None)  # gives each role a metrics port, if asked to
    metrics.watch(roles)  # the list itself: loaders the autoscaler starts are added to it

    def start_loader(source: str, instance: int) -> RoleProcess:
        load = ["load", *common, "--source", source, "--instance", str(instance), "--until-drained"]
        load += metrics.port_flag("loader", f"load-{source}-{instance}", source, instance)
        role = _start(f"load-{source}-{instance}", folder, [*MIXFLOW, *load])
        role.source, role.instance = source, instance
        return role

    roles.extend(start_loader(source.name, i) for source in spec.sources for i in range(source.loaders))
    roles.extend(_start_constructors(spec.constructor.lanes, shadows, common, folder, metrics))
    if trainer:
        roles.append(_start("train", folder, trainer, {"KAFKA_BOOTSTRAP_SERVERS": bootstrap} if bootstrap else None))
    scaling = None
    if spec.autoscaling.enabled:
        scaling = LoaderScaling(
            spec, spec.kafka.client_config(bootstrap, role="operator"), start_loader, folder, max_total_loaders
        )
    try:
        _wait(roles, progress, scaling)
    except BaseException:
        _stop(roles)
        raise
    finally:
        if scaling is not None:
            scaling.close()
    return roles


def _start_constructors(
    lanes: int, shadows: int, common: list[str], folder: Path, metrics: RunMetrics
) -> list[RoleProcess]:
    """A constructor for each lane, and ``shadows`` more per lane waiting to take over from it."""
    started = []
    for lane in range(lanes):
        for i in range(1 + shadows):
            name = "construct" + (f"-lane{lane}" if lanes > 1 else "") + (f"-{i}" if i else "")
            construct = ["construct", *common, "--instance", name, *(["--lane", str(lane)] if lanes > 1 else [])]
            construct += metrics.port_flag("constructor", name, None, i)
            started.append(_start(name, folder, [*MIXFLOW, *construct]))
    return started


def _stop(roles: list[RoleProcess]) -> None:
    """Terminate every role still running and wait for it; one that does not stop within 60 s is killed."""
    for role in roles:
        if role.process.poll() is None:
            role.process.terminate()
    for role in roles:
        try:
            role.process.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a role that does not stop must not hide the error
            role.process.kill()
            role.process.wait()


class LoaderScaling:
    """The supervisor's autoscaling: every ``autoscaling.interval_s`` it runs the policy and starts loaders
    (fresh instance numbers) or stops them gracefully (SIGTERM: the loader finishes its current units,
    commits, leaves its group and exits). Instance 0 plans the source's work and is never stopped; a
    source whose loader finished on its own (every unit done) gets no new loaders."""

    def __init__(
        self,
        spec: JobSpec,
        config: dict,
        start_loader: Callable[[str, int], RoleProcess],
        folder: Path,
        max_total_loaders: int | None = None,
    ) -> None:
        self.spec = spec
        self.autoscaler = Autoscaler(spec, PolicySettings.from_spec(spec.autoscaling, max_total_loaders))
        self.probe = JobProbe(config, spec.job, spec.source_names)
        self.start_loader = start_loader
        self.next_instance = {s.name: s.loaders for s in spec.sources}
        self.drained: set[str] = set()
        self.next_at = time.monotonic() + spec.autoscaling.interval_s
        self.decisions_file = folder / DECISIONS_FILE  # every decision, one JSON line each

    def poll(self, running: list[RoleProcess]) -> list[RoleProcess]:
        """Decide when an interval has passed; the loaders started, for the caller to supervise."""
        now = time.monotonic()
        if now < self.next_at:
            return []
        self.next_at = now + self.spec.autoscaling.interval_s
        active = {s: [r for r in running if r.source == s and not r.retiring] for s in self.spec.source_names}
        try:
            decisions = self.autoscaler.tick(self.probe, {s: len(r) for s, r in active.items()}, now)
        except (KafkaException, MixflowError, TimeoutError) as exc:  # the job goes on; the next interval retries
            log.warning("autoscaler: cannot read the job now (%s); keeping the loaders as they are", exc)
            return []
        started = []
        with self.decisions_file.open("a") as out:
            for d in decisions:
                loaders = active[d.source]
                if d.desired > len(loaders) and d.source not in self.drained:
                    for _ in range(d.desired - len(loaders)):
                        started.append(self.start_loader(d.source, self.next_instance[d.source]))
                        self.next_instance[d.source] += 1
                    log.info("autoscale: started %d loaders: %s", d.desired - len(loaders), d.line())
                elif d.desired < len(loaders):
                    stoppable = sorted((r for r in loaders if r.instance), key=lambda r: -(r.instance or 0))
                    for role in stoppable[: len(loaders) - d.desired]:
                        role.retiring = True
                        role.process.terminate()  # SIGTERM: finish the current units, commit, leave the group
                        log.info("autoscale: stopping %s (pid %d): %s", role.name, role.process.pid, d.line())
                running_now = sum(not r.retiring for r in loaders) + sum(r.source == d.source for r in started)
                out.write(json.dumps({"time": round(now, 3), **asdict(d), "running": running_now}) + "\n")
        return started

    def finished(self, role: RoleProcess) -> None:
        """``role`` exited 0 on its own: a loader does so once its source's units are all done."""
        if role.source is not None and not role.retiring:
            self.drained.add(role.source)

    def close(self) -> None:
        self.probe.close()


def trainer_command(template: str, spec_path: Path, out: Path, metrics_port: int = 0) -> list[str]:
    """A training command line from ``template``, with ``{python}``, ``{spec}``, ``{out}`` and
    ``{metrics_port}`` (the first of the sinks' ports, 0 when off) filled in."""
    fields = {"python": sys.executable, "spec": str(spec_path), "out": str(out), "metrics_port": str(metrics_port)}
    try:
        return [word.format(**fields) for word in shlex.split(template)]
    except (KeyError, IndexError, ValueError) as exc:
        fields_help = "{python}, {spec}, {out} and {metrics_port}"
        msg = f"bad --trainer command {template!r} ({exc}); it may use {fields_help}"
        raise MixflowError(msg) from exc


def _start(name: str, folder: Path, command: list[str], env: dict[str, str] | None = None) -> RoleProcess:
    log_file = folder / f"{name}.log"
    with log_file.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env} if env else None
        )
    log.info("started %s (pid %d), log %s", name, process.pid, log_file)
    return RoleProcess(name, process, log_file, env)


def _wait(roles: list[RoleProcess], progress: JobProgress | None, scaling: LoaderScaling | None = None) -> None:
    running = list(roles)
    while running:
        if progress is not None:
            progress.update([role.name for role in running])
        if scaling is not None and any(role.source is None for role in running):  # while others still need data
            started = scaling.poll(running)
            roles.extend(started)
            running.extend(started)
        for role in list(running):
            if role.restart_at is not None:
                if time.monotonic() >= role.restart_at:
                    _restart(role)
                continue
            code = role.process.poll()
            if code is not None:
                _exited(role, code, running, scaling)
        time.sleep(0.2)  # supervising child processes: nothing to wait on but their exit


def _exited(role: RoleProcess, code: int, running: list[RoleProcess], scaling: LoaderScaling | None) -> None:
    """``role`` exited with ``code``: a role the autoscaler retired or that finished leaves ``running``; one
    that failed is started again after a backoff, up to ``MAX_RESTARTS`` times, and then raises."""
    if role.retiring:
        running.remove(role)
        # -SIGTERM: it was still starting, before it handles the signal; it had taken no unit yet.
        clean = code in (0, -signal.SIGTERM)
        (log.info if clean else log.warning)("%s stopped by the autoscaler (exit %d)", role.name, code)
        return
    if code == 0 and scaling is not None:
        scaling.finished(role)
    if code == RefusedError.exit_code:
        running.remove(role)
        raise RefusedError(f"{role.name} was refused and is not started again: {_last_line(role)}")
    if code == NotFoundError.exit_code:
        running.remove(role)
        raise NotFoundError(f"{role.name} did not find what it needs and is not started again: {_last_line(role)}")
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
        return
    running.remove(role)
    if code != 0:
        msg = (
            f"{role.name} exited with {code} after {role.restarts} restarts; the end of {role.log_file}:\n{role.tail()}"
        )
        raise MixflowError(msg)
    log.info("%s finished: %s", role.name, role.summary())


def _last_line(role: RoleProcess) -> str:
    """The role's last log line: its error, for a role that stopped on one."""
    lines = role.tail(1).strip()
    return lines.removeprefix("mixflow ").split(": error: ", 1)[-1] if lines else f"see {role.log_file}"


def _restart(role: RoleProcess) -> None:
    role.restart_at = None
    with role.log_file.open("ab") as out:
        env = {**os.environ, **role.env} if role.env else None
        role.process = subprocess.Popen(role.process.args, stdout=out, stderr=subprocess.STDOUT, env=env)
    log.info("restarted %s (pid %d)", role.name, role.process.pid)
