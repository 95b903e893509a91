"""The role processes of a chaos run and their supervisor: it starts them, kills them when the run says,
starts a killed role again at once, and tells a role that died on its own (a failure) from one the run
killed or asked to stop, or whose rights the run revoked (a refusal: exit 5 with one line naming it, started
again once the rights are back, as an operator who restored them would)."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from topics.errors import STUCK_CLIENT_EXIT, BrokerUnreachableError, RefusedError

log = logging.getLogger(__name__)

# A role that died on its own is started again after this long (the run goes on; the failure is reported).
FAILED_RESTART_DELAY_S = 1.0
# A line by which a role reports an error: a traceback, or the CLI's one-line error (a SIGKILL leaves neither).
ERROR_LINE = re.compile(r"Traceback \(most recent call last\)|mixflow [a-z-]+: error:|chaos sink: error:")
REFUSED_EXIT = RefusedError.exit_code


class RoleKind(StrEnum):
    LOADER = "loader"
    CONSTRUCTOR = "constructor"
    SINK = "sink"


@dataclass(frozen=True)
class Failure:
    """A role process that exited when nobody killed it or asked it to stop, or with an error when asked."""

    role: str
    pid: int
    code: int
    log_tail: str

    def describe(self) -> str:
        return f"{self.role} (pid {self.pid}) exited with {self.code}; its log ends with:\n{self.log_tail}"


@dataclass
class Revocation:
    """Rights the run took away from ``roles`` (by name) at ``began`` and gave back at ``restored``: a role of
    them that exits 5 with a last error line matching ``names`` is refused, not failed."""

    what: str  # "the ACLs of User:<job>-trainer", "the storage key <access key>"
    roles: frozenset[str]
    names: re.Pattern[str]
    began: float
    restored: float | None = None
    refused: list[str] = field(default_factory=list)  # the roles it stopped, in the order they stopped

    def covers(self, role: Role) -> bool:
        """Whether the role's current process ran while these rights were away."""
        return role.name in self.roles and (self.restored is None or self.restored >= role.started_at)


@dataclass(frozen=True)
class Refusal:
    """A role that stopped with exit 5 because the run revoked its rights, and the line it said so in."""

    role: str
    pid: int
    what: str  # the revocation's
    line: str


@dataclass
class Role:
    name: str
    kind: RoleKind
    command: list[str]
    log_file: Path
    finite: bool  # ends by itself with 0 when its work is done
    process: subprocess.Popen | None = None
    starts: int = 0
    kills: int = 0
    stuck_exits: int = 0  # exits with STUCK_CLIENT_EXIT: started again, as `mixflow run` does
    # Exits because no broker answered at start (BrokerUnreachableError) while the run had the broker away:
    # started again, as `mixflow run` does.
    unreachable_exits: int = 0
    refused_exits: int = 0  # exits with 5 while the run had its rights revoked: started again once they are back
    held: Revocation | None = None  # refused, and not started again until these rights are back
    started_at: float = 0.0  # the current process's
    log_start: int = 0  # where the current process's output begins in the log
    restart_at: float | None = None
    stopping: bool = False  # asked to stop: its exit with 0 is expected
    done: bool = False

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 15) -> str:
        """The end of the current process's log, without librdkafka's own lines (``%<level>|...``), which
        fill it while the broker is away."""
        with self.log_file.open("rb") as file:
            file.seek(self.log_start)
            text = file.read().decode(errors="replace")
        return "\n".join([line for line in text.splitlines() if not line.startswith("%")][-lines:])


@dataclass
class Supervisor:
    """Role processes with their output in ``folder/<role>.log``; ``poll()`` often, to notice exits."""

    folder: Path
    env: dict[str, str]
    roles: dict[str, Role] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    # When the run stopped its broker, and when it answered again (None: still away).
    broker_away: list[tuple[float, float | None]] = field(default_factory=list)
    revocations: list[Revocation] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)

    def start(self, name: str, kind: RoleKind, command: list[str], *, finite: bool = False) -> Role:
        role = Role(name, kind, command, self.folder / f"{name}.log", finite)
        self.roles[name] = role
        self._spawn(role)
        return role

    def of_kind(self, kind: RoleKind) -> list[Role]:
        return [role for role in self.roles.values() if role.kind is kind and not role.done]

    def kill(self, role: Role) -> float:
        """SIGKILL the role's process; the next ``poll()`` starts it again. The moment of the kill."""
        assert role.process is not None
        os.kill(role.process.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        if role.process.wait() != -signal.SIGKILL:  # it had ended by itself (refused, say): poll() sorts it out
            log.info("%s (pid %d) had ended before the kill", role.name, role.process.pid)
            return killed_at
        role.kills += 1
        role.restart_at = killed_at
        log.info("killed %s (pid %d)", role.name, role.process.pid)
        return killed_at

    def revoke(self, what: str, roles: frozenset[str], names: re.Pattern[str]) -> Revocation:
        """Note that the run has taken ``what`` away from ``roles``: their exits with 5 naming it (``names``)
        are refusals from now on, held until ``restore``."""
        revocation = Revocation(what, roles, names, time.monotonic())
        self.revocations.append(revocation)
        return revocation

    def restore(self, revocation: Revocation) -> None:
        """The rights are back: start the roles they held at once."""
        revocation.restored = time.monotonic()
        for role in self.roles.values():
            if role.held is revocation:
                role.held = None
                role.restart_at = revocation.restored

    def poll(self) -> None:
        """Start again the roles due, and sort out the exits: done, refused (started again once its rights are
        back), or a failure (then started again)."""
        for role in self.roles.values():
            if role.done or role.held is not None:
                continue
            if role.restart_at is not None:
                if time.monotonic() >= role.restart_at:
                    self._spawn(role)
                continue
            if role.process is None or (code := role.process.poll()) is None:
                continue
            # -SIGTERM after a stop was asked: it was still starting, before it handles the signal.
            if (code == 0 and role.finite) or (role.stopping and code in (0, -signal.SIGTERM)):
                role.done = True
                continue
            if code == STUCK_CLIENT_EXIT and not role.stopping:
                role.stuck_exits += 1
                role.restart_at = time.monotonic() + FAILED_RESTART_DELAY_S
                log.warning("%s (pid %d): its Kafka client got stuck; starting it again", role.name, role.process.pid)
                continue
            if code == BrokerUnreachableError.exit_code and not role.stopping and self._broker_was_away(role):
                role.unreachable_exits += 1
                role.restart_at = time.monotonic() + FAILED_RESTART_DELAY_S
                log.warning("%s (pid %d): no broker answered (it restarted); starting it again", role.name, role.pid)
                continue
            if code == REFUSED_EXIT and not role.stopping and self._refusal(role) is not None:
                continue
            failure = Failure(role.name, role.process.pid, code, role.tail())
            self.failures.append(failure)
            log.error("%s", failure.describe())
            if role.stopping:
                role.done = True
            else:
                role.restart_at = time.monotonic() + FAILED_RESTART_DELAY_S

    def _refusal(self, role: Role) -> Refusal | None:
        """The refusal that ended ``role``'s process with exit 5, if the run had revoked its rights meanwhile and
        its last error line names them; the role is held until they are back (started again soon after, when
        they are back already)."""
        assert role.process is not None
        said = [line for line in role.tail(40).splitlines() if ERROR_LINE.match(line)]
        for revocation in reversed(self.revocations):
            if revocation.covers(role) and said and revocation.names.search(said[-1]):
                refusal = Refusal(role.name, role.process.pid, revocation.what, said[-1])
                self.refusals.append(refusal)
                revocation.refused.append(role.name)
                role.refused_exits += 1
                if revocation.restored is None:
                    role.held = revocation
                else:
                    role.restart_at = time.monotonic() + FAILED_RESTART_DELAY_S
                log.warning("%s (pid %d) refused (%s): %s", role.name, role.process.pid, revocation.what, said[-1])
                return refusal
        return None

    def logged_errors(self) -> dict[str, int]:
        """Per role, the errors its log reports over all its processes (none for a role that only was killed)."""
        counts = {}
        for role in self.roles.values():
            with role.log_file.open(errors="replace") as log_file:
                # Each stuck-client or unreachable exit says so in one error line: that restart is reported apart.
                errors = sum(1 for line in log_file if ERROR_LINE.match(line)) - role.stuck_exits
                errors -= role.unreachable_exits + role.refused_exits
                if errors > 0:
                    counts[role.name] = errors
        return counts

    def stuck_restarts(self) -> dict[str, int]:
        """Per role, how often its Kafka client got stuck and it was started again."""
        return {role.name: role.stuck_exits for role in self.roles.values() if role.stuck_exits}

    def unreachable_restarts(self) -> dict[str, int]:
        """Per role, how often it found no broker at start while the broker restarted, and was started again."""
        return {role.name: role.unreachable_exits for role in self.roles.values() if role.unreachable_exits}

    def _broker_was_away(self, role: Role) -> bool:
        """Whether the run had the broker away at some moment of the role's current process."""
        return any(answered is None or answered >= role.started_at for _, answered in self.broker_away)

    def terminate(self, roles: list[Role]) -> None:
        """Ask ``roles`` to stop (SIGTERM): each ends after its current piece of work."""
        for role in roles:
            role.stopping = True
            role.restart_at = None
            if role.held is not None:  # stopped already, refused
                role.held, role.done = None, True
            if role.running:
                role.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]

    def dump_stacks(self) -> None:
        """Have every running role print its threads' stacks into its log (SIGUSR1, ``mixflow`` and the chaos
        sink register faulthandler for it): what a stuck role was waiting on."""
        for role in self.roles.values():
            if role.running:
                os.kill(role.process.pid, signal.SIGUSR1)  # type: ignore[union-attr]
        time.sleep(1.0)  # faulthandler writes from a signal handler; give it a moment before the kill

    def kill_all(self) -> None:
        """End every role now (the run is over or failed); nothing more is recorded."""
        for role in self.roles.values():
            role.stopping = role.done = True
            role.restart_at = role.held = None
            if role.running:
                role.process.kill()  # type: ignore[union-attr]
        for role in self.roles.values():
            if role.process is not None:
                role.process.wait()

    def _spawn(self, role: Role) -> None:
        role.restart_at = None
        role.log_start = role.log_file.stat().st_size if role.log_file.exists() else 0
        with role.log_file.open("ab") as out:
            role.process = subprocess.Popen(
                role.command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env
            )
        role.starts += 1
        role.started_at = time.monotonic()
        log.debug("started %s (pid %d)", role.name, role.process.pid)
