"""A chaos run's job while faults strike: its role processes under a supervisor, what the run watches of it
through Kafka, and each fault struck and waited out until the job has survived it.

A kill is survived once the job wrote a step after it and the role is back (a killed sink has received a step
since, the constructors are all in the lease group again); a broker or object store fault once a step was
written after it. Revoking rights (``revoke-acls``, ``revoke-storage-key``) lasts the drawn while and then until
the roles it strikes have stopped with their refusal: every one for ACLs (each role talks to Kafka all the
time); at least one loader for a storage key (a loader between epochs reads nothing: when none read the store
in the drawn while, the fault's loader is restarted, as after a crash, and its start-up probe is refused). Then
the rights come back, the refused roles are started again, and the fault is survived as a kill of each is.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pipeline.spec import JobSpec
from pipeline.tools.chaos.access import Access, KafkaRights, StorageKey
from pipeline.tools.chaos.object_store import ChaosObjectStore
from pipeline.tools.chaos.options import ChaosError, ChaosOptions
from pipeline.tools.chaos.report import ChaosReport, InjectedFault
from pipeline.tools.chaos.roles import Role, RoleKind, Supervisor
from pipeline.tools.chaos.schedule import ACCESS_KINDS, OBJECT_STORE_KINDS, Fault, FaultKind
from pipeline.tools.chaos.sink_state import checkpoint_steps
from pipeline.tools.chaos.watch import Lease, LeaseWatch, StateWatch
from pipeline.tools.stack.local_broker import LocalBroker
from topics.kafka.acl_admin import AclAdmin
from topics.kafka.clients import KafkaConfig

log = logging.getLogger(__name__)


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
        *,
        acls: AclAdmin | None = None,
        remote: tuple[str, ...] = (),
    ) -> None:
        """``acls``: the secured broker's ACLs, as its admin; ``remote``: the sources read from ``store``."""
        self.options = options
        self.spec = spec
        self.folder = folder
        self.sinks = folder / "sinks"
        self.broker = broker
        self.store = store
        self.acls = acls
        self.remote = remote
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

        if fault.kind in ACCESS_KINDS:
            return self._revoke(fault)
        role = self._target(fault)
        what = f"{fault.describe()} ({role.name}, pid {role.pid})"
        received = self._received([role])
        killed_at = self.supervisor.kill(role)
        end = self.watch.end_offset()  # a step committed after the kill lies here or above
        self.supervisor.poll()  # starts the role again
        written = self._back(what, [role], end, received)
        gap = written - killed_at if fault.kind is FaultKind.KILL_ACTIVE_CONSTRUCTOR else None
        return InjectedFault(fault, role.name, at - self.began, time.monotonic() - at, gap_s=gap)

    def _revoke(self, fault: Fault) -> InjectedFault:
        """Take the rights away for ``fault.down_s`` and until the roles struck have stopped with the refusal,
        give them back, start the refused roles again and wait until they are back."""
        at = time.monotonic()
        access = self._access(fault)
        struck = frozenset(r.name for r in self.supervisor.roles.values() if access.strikes(r.name) and not r.done)
        what = f"{fault.describe()} ({access.what})"
        revocation = self.supervisor.revoke(access.what, struck, access.names)
        try:
            access.revoke()
            self._sleep(fault.down_s)
            restarted = None
            if fault.kind is FaultKind.REVOKE_STORAGE_KEY and not revocation.refused:
                # No loader read the store meanwhile (between epochs a loader reads nothing): one restarted, as
                # after a crash, probes it at its start and is refused.
                role = self.supervisor.roles[str(fault.target)]
                if role.running:
                    self.supervisor.kill(role)
                    restarted = role.name
            everyone = fault.kind is FaultKind.REVOKE_ACLS
            self._wait(
                lambda: set(revocation.refused) >= struck if everyone else bool(revocation.refused),
                self.options.fault_timeout_s,
                f"{what}: {'not every role' if everyone else 'no role'} of {sorted(struck)} stopped with the refusal",
                detail=lambda: f"refused: {sorted(revocation.refused)}",
            )
        finally:
            access.restore()  # also when the run fails here: the rights are back for whatever comes next
        refused = [self.supervisor.roles[name] for name in revocation.refused]
        received = self._received(refused)
        end = self.watch.end_offset()
        self.supervisor.restore(revocation)
        away = time.monotonic() - revocation.began
        self._back(f"{what}, back", refused, end, received)
        target = f"acls:{fault.target}" if fault.kind is FaultKind.REVOKE_ACLS else "storage-key"
        stopped = tuple(revocation.refused)
        return InjectedFault(
            fault, target, at - self.began, time.monotonic() - at, down_s=away, refused=stopped, restarted=restarted
        )

    def _access(self, fault: Fault) -> Access:
        if fault.kind is FaultKind.REVOKE_ACLS:
            assert self.acls is not None and fault.target is not None, "ACLs are revoked on a secured broker"
            return KafkaRights.of(self.acls, self.spec, fault.target)
        assert self.store is not None and self.store.user is not None, "a storage key is revoked in a store"
        return StorageKey(self.store, self.remote)

    def _received(self, roles: list[Role]) -> dict[str, int]:
        """The steps each sink of ``roles`` has checkpointed."""
        return {r.name: checkpoint_steps(self.sinks, _rank(r)) for r in roles if r.kind is RoleKind.SINK}

    def _back(self, what: str, roles: list[Role], end: int, received: dict[str, int]) -> float:
        """Wait until a step is committed at ``end`` of the state topic or after, each sink of ``roles`` received
        a step past ``received``, and with a constructor among them, every constructor is in the lease group;
        when the step was written."""
        timeout = self.options.fault_timeout_s
        self._wait(
            lambda: self.watch.arrival_at_or_after(end) is not None, timeout, f"{what}: no step was written after it"
        )
        for role in roles:
            if role.kind is RoleKind.SINK:
                rank = _rank(role)
                self._wait(
                    lambda: checkpoint_steps(self.sinks, rank) > received[role.name],  # noqa: B023 (waited here)
                    timeout,
                    f"{what}: {role.name} received no step after it",
                )
        if any(role.kind is RoleKind.CONSTRUCTOR for role in roles):
            self._wait(
                self._every_constructor_in_the_lease,
                timeout,
                f"{what}: the constructors did not all join the lease group again",
                detail=lambda: self._lease_seen.describe(),
            )
        written = self.watch.arrival_at_or_after(end)
        assert written is not None
        return written

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
