"""One chaos run: a whole job (loaders, an active constructor and its shadows, one sink per rank) as
processes, faults injected by a seeded schedule, then a drain to the end of the job and an audit.

The job streams (``on_exhausted: next_epoch``) while faults are injected, so every role keeps working
however long the faults take. Each fault waits until the one before is survived: the job wrote a step
after it and a killed role runs again (a killed sink has received a step since, the constructors are all
back in the lease group). To end, the loaders and constructors are stopped and started again under the
same spec with ``on_exhausted: renormalize``: they finish the epochs planned, the constructor writes what
is left and the end-of-data record, and the sinks end there. The audit then reads the topics.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.spec import JobSpec, load_spec
from pipeline.tools.chaos.audit import audit_job
from pipeline.tools.chaos.object_store import ChaosObjectStore
from pipeline.tools.chaos.report import ChaosReport, InjectedFault
from pipeline.tools.chaos.roles import Role, RoleKind, Supervisor
from pipeline.tools.chaos.schedule import DEFAULT_WEIGHTS, OBJECT_STORE_KINDS, Fault, FaultKind, Targets, plan_faults
from pipeline.tools.chaos.secured import RunPrincipals, grant_job_acls, secured_broker
from pipeline.tools.chaos.sink_state import checkpoint_steps
from pipeline.tools.chaos.watch import Lease, LeaseWatch, StateWatch
from pipeline.tools.stack.local_broker import LocalBroker, default_state_dir, free_port_block, free_port_pair
from topics.errors import MixflowError, RefusedError
from topics.kafka.admin import ensure_job_topics
from topics.kafka.clients import KafkaConfig

log = logging.getLogger(__name__)


class ChaosError(MixflowError):
    """The run could not go on: a fault was not survived in time, or the job did not start or end."""


@dataclass(frozen=True)
class ChaosOptions:
    spec: Path
    faults: int
    seed: int
    out: Path | None = None  # a new or empty folder; by default <state dir>/chaos/<job>
    shadows: int = 1
    bootstrap: str | None = None  # a broker to use instead of a private one; no broker restarts then
    kinds: tuple[FaultKind, ...] | None = None  # the kinds of fault to draw from; None: every one with a target
    fault_timeout_s: float = 120.0  # for each fault to be survived
    start_timeout_s: float = 300.0  # for the first step to reach every sink
    drain_timeout_s: float = 600.0  # for the job to end once the faults are over
    max_pause_s: float = 2.0  # before each fault, once the previous one was survived
    max_down_s: float = 3.0  # a restarted broker or object store stays down up to this long
    # The folder of a running local object store (``LocalObjectStore``) that the spec's s3:// sources read:
    # the roles reach it through a fault proxy of the run; the run restarts, stalls, slows and refuses it.
    object_store: Path | None = None
    max_stall_s: float = 5.0  # an object store is stalled, slow or refusing for 1 s up to this long
    max_lead_steps: int | None = None  # overrides the spec's constructor.max_lead_steps (the sinks pace it)
    # The private broker is secured (``mixflow stack up --secure``); each role runs as a SCRAM user of its own
    # with the job's ACLs (``secured.py``).
    secure: bool = False


def run_chaos(options: ChaosOptions) -> ChaosReport:
    """Run the job of ``options.spec`` under the faults of ``options.seed``; report. Logs, the specs, the
    sinks' records and ``report.json`` go to ``options.out`` (the private broker's folder too)."""
    began = time.monotonic()
    if options.secure and options.bootstrap is not None:
        msg = "a secured chaos run (--secure) starts a secured broker of its own: leave out --bootstrap-servers"
        raise MixflowError(msg)
    job = f"chaos-{options.seed}-{uuid.uuid4().hex[:6]}"
    folder = (options.out or default_state_dir() / "chaos" / job).absolute()
    if folder.exists() and any(folder.iterdir()):
        msg = f"{folder} holds files already (a run's sink checkpoints would be taken up): give a new or empty folder"
        raise RefusedError(msg)
    base = load_spec(options.spec)
    if base.constructor.lanes > 1:
        msg = (
            f"mixflow chaos runs one constructor lane; {options.spec} has constructor.lanes "
            f"{base.constructor.lanes} (lanes under SIGKILL are tested by tests/test_lanes.py)"
        )
        raise MixflowError(msg)
    targets = Targets(
        loaders=tuple(f"load-{s.name}-{i}" for s in base.sources for i in range(s.loaders)),
        sinks=tuple(f"sink-{r}" for r in range(base.step.ranks)),
        shadows=options.shadows,
        broker=options.bootstrap is None,
        object_store=options.object_store is not None,
    )
    if options.kinds is not None and (missing := targets.missing(options.kinds)):
        msg = f"--kinds: this run cannot inject {'; '.join(missing)}"
        raise MixflowError(msg)
    store = ChaosObjectStore.running(options.object_store) if options.object_store else None
    folder.mkdir(parents=True, exist_ok=True)
    kinds = targets.kinds() if options.kinds is None else options.kinds
    weights = {kind: weight for kind, weight in DEFAULT_WEIGHTS.items() if kind in kinds}
    maxima = {"max_pause_s": options.max_pause_s, "max_down_s": options.max_down_s, "max_stall_s": options.max_stall_s}
    faults = plan_faults(options.seed, options.faults, targets, weights, **maxima)
    report = ChaosReport(job, options.seed, options.shadows, targets.broker, folder, planned=faults)
    report.secured = options.secure
    broker = None if options.bootstrap else _private_broker(folder / "broker", options.secure)
    try:
        bootstrap = broker.up() if broker is not None else str(options.bootstrap)
        if store is not None:
            store.open()
        principals = None
        if broker is not None and options.secure:
            principals = RunPrincipals.create(folder, job, base.source_names, broker)
        spec, streaming, draining = _write_specs(
            options.spec, job, bootstrap, folder, options.max_lead_steps, store, principals
        )
        if broker is not None and principals is not None:
            grant_job_acls(broker, spec)  # before the operator creates the topics
        config = spec.kafka.client_config(bootstrap, role="operator")
        ensure_job_topics(config, spec.job, spec.source_names, spec.step.ranks, lanes=spec.constructor.lanes)
        live = LiveJob(options, spec, config, folder, broker, store)
        try:
            live.run(faults, streaming, draining, report)
        finally:
            live.close()
            report.failures = list(live.supervisor.failures)
            report.errors_logged = live.supervisor.logged_errors()
            report.stuck_restarts = live.supervisor.stuck_restarts()
            report.unreachable_restarts = live.supervisor.unreachable_restarts()
        if report.error is None:
            phase = time.monotonic()
            with store.environ() if store is not None else contextlib.nullcontext():  # s3:// sources: keys
                report.audit = audit_job(config, spec, folder / "sinks")
            report.phases_s["audit"] = time.monotonic() - phase
    finally:
        if store is not None:
            store.close()
        if broker is not None:
            broker.down()
        report.wall_s = time.monotonic() - began
        (folder / "report.json").write_text(report.to_json())
    return report


def _private_broker(state_dir: Path, secure: bool) -> LocalBroker:
    port = free_port_block(3) if secure else free_port_pair()  # a secured broker's mTLS listener: port + 2
    return secured_broker(state_dir, port) if secure else LocalBroker(state_dir, port=port)


def _write_specs(
    spec_path: Path,
    job: str,
    bootstrap: str,
    folder: Path,
    max_lead_steps: int | None,
    store: ChaosObjectStore | None = None,
    principals: RunPrincipals | None = None,
) -> tuple[JobSpec, Path, Path]:
    """The spec under ``job`` on ``bootstrap`` (and the object store's proxy; a secured run's principals),
    streaming (``spec.yaml``), and for the drain."""
    body = load_spec(spec_path).model_dump(mode="json", exclude_none=True)
    if store is not None:
        body = store.through_proxy(body)
    body["job"] = job
    body["kafka"] = {**body.get("kafka", {}), "bootstrap_servers": bootstrap}
    if principals is not None:
        body["kafka"] = principals.kafka_section(body["kafka"])
    if max_lead_steps is not None:
        body["constructor"] = {**body.get("constructor", {}), "max_lead_steps": max_lead_steps}
    paths = []
    for name, policy in (("spec.yaml", "next_epoch"), ("drain-spec.yaml", "renormalize")):
        path = folder / name
        path.write_text(yaml.safe_dump({**body, "on_exhausted": policy}, sort_keys=False))
        paths.append(path)
    return load_spec(paths[0]), paths[0], paths[1]


class LiveJob:
    """The job's processes, and what the run watches of it, while faults strike."""

    def __init__(
        self,
        options: ChaosOptions,
        spec: JobSpec,
        config: KafkaConfig,
        folder: Path,
        broker: LocalBroker | None,
        store: ChaosObjectStore | None = None,
    ) -> None:
        self.options = options
        self.spec = spec
        self.folder = folder
        self.sinks = folder / "sinks"
        self.broker = broker
        self.store = store
        self.bootstrap = str(config["bootstrap.servers"])
        self.began = time.monotonic()
        env = {
            **os.environ,
            **(self.store.environment() if self.store else {}),
            "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
        }
        self.supervisor = Supervisor(folder, env)
        self.watch = StateWatch(config, spec.job)
        self.lease = LeaseWatch(config, spec.job)
        self._lease_seen = Lease()

    def run(self, faults: tuple[Fault, ...], streaming: Path, draining: Path, report: ChaosReport) -> None:
        phase = time.monotonic()
        try:
            self._start(streaming)
            self._wait(self._every_sink_has_a_step, self.options.start_timeout_s, "the job did not reach every sink")
            phase = self._phase(report, "start", phase)
            for fault in faults:
                self._sleep(fault.pause_s)
                report.injected.append(self._inject(fault))
                log.info("%s survived", fault.describe())
            phase = self._phase(report, "faults", phase)
            self._drain(draining)
            self._phase(report, "drain", phase)
        except ChaosError as exc:
            self.supervisor.dump_stacks()
            report.error = f"{exc} (the stacks of the roles still running are at the end of their logs)"
            log.error("chaos run stopped: %s", exc)

    def close(self) -> None:
        self.supervisor.kill_all()
        self.watch.close()

    # -- roles ----------------------------------------------------------------------------------------

    def _start(self, spec_path: Path) -> None:
        for source in self.spec.sources:
            for i in range(source.loaders):
                command = _loader(spec_path, self.bootstrap, source.name, i)
                self.supervisor.start(f"load-{source.name}-{i}", RoleKind.LOADER, command)
        for k in range(1 + self.options.shadows):
            self.supervisor.start(f"construct-{k}", RoleKind.CONSTRUCTOR, _constructor(spec_path, self.bootstrap))
        for rank in range(self.spec.step.ranks):
            command = [
                *(sys.executable, "-m", "pipeline.tools.chaos.sink", "--spec", str(spec_path), "--rank", str(rank)),
                *("--out", str(self.sinks), "--bootstrap-servers", self.bootstrap),
            ]
            self.supervisor.start(f"sink-{rank}", RoleKind.SINK, command, finite=True)

    def _drain(self, spec_path: Path) -> None:
        """Stop the streaming roles, then run the job to its end under ``on_exhausted: renormalize``."""
        streaming = self.supervisor.of_kind(RoleKind.LOADER) + self.supervisor.of_kind(RoleKind.CONSTRUCTOR)
        self.supervisor.terminate(streaming)
        self._wait(lambda: all(r.done for r in streaming), 120, "the loaders and constructors did not stop")
        ending = self.supervisor.of_kind(RoleKind.SINK)
        for source in self.spec.sources:
            for i in range(source.loaders):
                command = [*_loader(spec_path, self.bootstrap, source.name, i), "--until-drained"]
                name = f"drain-load-{source.name}-{i}"
                ending.append(self.supervisor.start(name, RoleKind.LOADER, command, finite=True))
        command = _constructor(spec_path, self.bootstrap)
        ending.append(self.supervisor.start("drain-construct", RoleKind.CONSTRUCTOR, command, finite=True))
        self._wait(lambda: all(r.done for r in ending), self.options.drain_timeout_s, "the job did not end")

    # -- faults ---------------------------------------------------------------------------------------

    def _inject(self, fault: Fault) -> InjectedFault:
        """Strike, then wait until the job has survived it."""
        at = time.monotonic()
        timeout = self.options.fault_timeout_s
        if fault.kind in (FaultKind.RESTART_BROKER, *OBJECT_STORE_KINDS):
            down = self._restart_broker(fault.down_s) if fault.kind is FaultKind.RESTART_BROKER else None
            if fault.kind in OBJECT_STORE_KINDS:
                assert self.store is not None, "no object store faults without an object store"
                down = self.store.strike(fault, self._sleep)
            end = self.watch.end_offset()
            what = fault.describe()
            self._wait(
                lambda: self.watch.arrival_at_or_after(end) is not None,
                timeout,
                f"{what}: no step was written after it",
            )
            target = "broker" if fault.kind is FaultKind.RESTART_BROKER else "object-store"
            return InjectedFault(fault, target, at - self.began, time.monotonic() - at, down_s=down)

        role = self._target(fault)
        what = f"{fault.describe()} ({role.name}, pid {role.pid})"
        received = checkpoint_steps(self.sinks, _rank(role)) if role.kind is RoleKind.SINK else 0
        killed_at = self.supervisor.kill(role)
        end = self.watch.end_offset()  # a step committed after the kill lies here or above
        self.supervisor.poll()  # starts the role again
        self._wait(
            lambda: self.watch.arrival_at_or_after(end) is not None, timeout, f"{what}: no step was written after it"
        )
        written = self.watch.arrival_at_or_after(end)
        gap = written - killed_at if fault.kind is FaultKind.KILL_ACTIVE_CONSTRUCTOR and written else None
        if role.kind is RoleKind.SINK:
            rank = _rank(role)
            self._wait(
                lambda: checkpoint_steps(self.sinks, rank) > received,
                timeout,
                f"{what}: the sink received no step after it",
            )
        if role.kind is RoleKind.CONSTRUCTOR:
            self._wait(
                self._every_constructor_in_the_lease,
                timeout,
                f"{what}: the constructors did not all join the lease group again",
                detail=lambda: self._lease_seen.describe(),
            )
        return InjectedFault(fault, role.name, at - self.began, time.monotonic() - at, gap_s=gap)

    def _target(self, fault: Fault) -> Role:
        """The role a kill strikes: named by the schedule, or a constructor that holds the lease (active)
        or does not (shadow)."""
        if fault.target is not None:
            return self.supervisor.roles[fault.target]
        active = fault.kind is FaultKind.KILL_ACTIVE_CONSTRUCTOR
        found: list[Role] = []
        seen: list[str] = []

        def look() -> bool:
            lease = self.lease.look()
            running = [r for r in self.supervisor.of_kind(RoleKind.CONSTRUCTOR) if r.running]
            seen[:] = [f"{lease.describe()}; constructors running: {[r.pid for r in running]}"]
            if lease.holder in {r.pid for r in running}:
                found[:] = [r for r in running if (r.pid == lease.holder) == active]
            return bool(found)

        kind = "active" if active else "shadow"
        self._wait(
            look,
            self.options.fault_timeout_s,
            f"{fault.describe()}: found no {kind} constructor to kill",
            detail=lambda: seen[0],
        )
        return found[fault.number % len(found)]

    def _restart_broker(self, down_s: float) -> float:
        """Stop the broker, keep it down ``down_s``, start it again; seconds until it answered."""
        assert self.broker is not None, "no broker restarts on a broker the run did not start"
        stopped = time.monotonic()
        self.supervisor.broker_away.append((stopped, None))
        self.broker.down()
        self._sleep(down_s)
        self.broker.up()
        answered = time.monotonic()
        self.supervisor.broker_away[-1] = (stopped, answered)
        return answered - stopped

    # -- waiting --------------------------------------------------------------------------------------

    def _every_sink_has_a_step(self) -> bool:
        return all(checkpoint_steps(self.sinks, r) > 0 for r in range(self.spec.step.ranks))

    def _every_constructor_in_the_lease(self) -> bool:
        self._lease_seen = self.lease.look()
        running = {r.pid for r in self.supervisor.of_kind(RoleKind.CONSTRUCTOR) if r.running}
        return self._lease_seen.holder in running and running <= self._lease_seen.members

    def _wait(
        self, done: Callable[[], bool], timeout_s: float, failing: str, detail: Callable[[], str] | None = None
    ) -> None:
        """Until ``done()``, supervising the roles; ``ChaosError(failing)`` after ``timeout_s``, with
        ``detail()`` when given."""
        deadline = time.monotonic() + timeout_s
        while not done():
            self.supervisor.poll()
            if time.monotonic() > deadline:
                more = f" ({detail()})" if detail is not None else ""
                raise ChaosError(f"{failing} within {timeout_s:.0f} s{more}; the role logs are in {self.folder}")
            time.sleep(0.05)  # processes, files and a topic watched from outside: nothing to block on

    def _sleep(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        self._wait(lambda: time.monotonic() >= until, seconds + 60, "sleeping")

    @staticmethod
    def _phase(report: ChaosReport, name: str, since: float) -> float:
        now = time.monotonic()
        report.phases_s[name] = now - since
        return now


def _rank(role: Role) -> int:
    return int(role.name.rpartition("-")[2])


def _loader(spec: Path, bootstrap: str, source: str, instance: int) -> list[str]:
    return [
        *(sys.executable, "-m", "pipeline.cli", "load", "--spec", str(spec)),
        *("--source", source, "--instance", str(instance), "--bootstrap-servers", bootstrap),
    ]


def _constructor(spec: Path, bootstrap: str) -> list[str]:
    return [
        *(sys.executable, "-m", "pipeline.cli", "construct", "--spec", str(spec), "--bootstrap-servers", bootstrap),
    ]
