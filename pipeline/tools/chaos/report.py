"""What a chaos run reports: the faults injected and survived, the roles that failed on their own, the
takeover gaps after killing the active constructor, and the end-of-run audit."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.tools.chaos.audit import JobAudit
from pipeline.tools.chaos.roles import Failure, Refusal
from pipeline.tools.chaos.schedule import Fault, FaultKind


@dataclass(frozen=True)
class InjectedFault:
    fault: Fault
    # The role process killed, "broker", "object-store", "acls:<principal key>" or "storage-key".
    target: str
    at_s: float  # since the run began
    survived_s: float | None  # from the fault until the job wrote a step after it and the role was back
    gap_s: float | None = None  # killing the active constructor: until the next step was written
    # A broker or object store restart or stall: from the fault until it answered; revoked rights: until given back.
    down_s: float | None = None
    refused: tuple[str, ...] = ()  # revoked rights: the roles that stopped with the refusal (started again)
    restarted: str | None = None  # a revoked storage key no loader read meanwhile: the loader restarted to read it


@dataclass
class ChaosReport:
    job: str
    seed: int
    shadows: int
    private_broker: bool
    folder: Path
    planned: tuple[Fault, ...]
    injected: list[InjectedFault] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)  # roles stopped by revoked rights (exit 5), not failures
    errors_logged: dict[str, int] = field(default_factory=dict)  # role: errors its log reports
    stuck_restarts: dict[str, int] = field(default_factory=dict)  # role: restarts after a stuck Kafka client
    # role: restarts after it found no broker at start while the run restarted the broker
    unreachable_restarts: dict[str, int] = field(default_factory=dict)
    audit: JobAudit | None = None
    error: str | None = None
    wall_s: float = 0.0
    phases_s: dict[str, float] = field(default_factory=dict)
    secured: bool = False  # the private broker was secured, each role its own principal

    @property
    def survived(self) -> int:
        return sum(f.survived_s is not None for f in self.injected)

    @property
    def ok(self) -> bool:
        """Every planned fault injected and survived, no role failed on its own, and the audit passed."""
        return (
            self.error is None
            and not self.failures
            and not self.errors_logged
            and self.survived == len(self.planned)
            and self.audit is not None
            and self.audit.ok
        )

    @property
    def gaps_s(self) -> list[float]:
        return [f.gap_s for f in self.injected if f.gap_s is not None]

    def by_kind(self) -> dict[FaultKind, tuple[int, int]]:
        """Per kind: (injected, survived)."""
        counts: dict[FaultKind, tuple[int, int]] = {}
        for f in self.injected:
            injected, survived = counts.get(f.fault.kind, (0, 0))
            counts[f.fault.kind] = (injected + 1, survived + (f.survived_s is not None))
        return counts

    def lines(self) -> list[str]:
        where = "a private broker" if self.private_broker else "the given broker (no broker restarts)"
        if self.secured:
            where = "a private secured broker (SASL_SSL, SCRAM, a principal and ACLs per role)"
        kinds = ", ".join(f"{kind} {i}/{s}" for kind, (i, s) in self.by_kind().items()) or "none"
        out = [
            f"chaos run of job {self.job}: seed {self.seed}, {len(self.planned)} faults planned, "
            f"{self.shadows} shadow constructor(s), on {where}; logs in {self.folder}",
            f"faults injected/survived: {len(self.injected)}/{self.survived} ({kinds})",
            f"roles that failed on their own: {len(self.failures)}"
            + (" (" + ", ".join(f"{f.role} exit {f.code}" for f in self.failures[:5]) + ")" if self.failures else ""),
            "errors in the role logs (tracebacks, 'mixflow ...: error:' lines): "
            + (", ".join(f"{role} {n}" for role, n in self.errors_logged.items()) or "none"),
            "roles started again after their Kafka client got stuck (exit 3, as mixflow run does): "
            + (", ".join(f"{role} {n}" for role, n in self.stuck_restarts.items()) or "none"),
            "roles started again after no broker answered at their start while it restarted (exit 6, as mixflow run "
            "does): " + (", ".join(f"{role} {n}" for role, n in self.unreachable_restarts.items()) or "none"),
            _refusal_line(self.refusals),
            *_storage_key_line(self.injected),
            *(f"  {r.role}: {r.line}" for r in _each_kind(self.refusals)),
            _gap_line(self.gaps_s),
        ]
        for kind in FaultKind:  # the broker's, object store's and rights' faults record how long they kept it away
            downs = [f.down_s for f in self.injected if f.down_s is not None and f.fault.kind is kind]
            if downs:
                out.append(f"{kind}: away {statistics.median(downs):.1f} s median, {max(downs):.1f} s worst")
        if self.audit is not None:
            out += self.audit.lines()
        phases = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in self.phases_s.items())
        out.append(f"wall time {self.wall_s:.0f} s ({phases})")
        if self.error:
            out.append(f"ERROR: {self.error}")
        for failure in self.failures[:3]:
            out.append(f"failure: {failure.describe()}")
        return out

    def to_json(self) -> str:
        body = {
            "job": self.job,
            "seed": self.seed,
            "shadows": self.shadows,
            "private_broker": self.private_broker,
            "secured": self.secured,
            "ok": self.ok,
            "error": self.error,
            "wall_s": round(self.wall_s, 1),
            "phases_s": {k: round(v, 1) for k, v in self.phases_s.items()},
            "planned": len(self.planned),
            "by_kind": {kind.value: {"injected": i, "survived": s} for kind, (i, s) in self.by_kind().items()},
            "faults": [
                {
                    "number": f.fault.number,
                    "kind": f.fault.kind.value,
                    "target": f.target,
                    "at_s": round(f.at_s, 2),
                    "survived_s": None if f.survived_s is None else round(f.survived_s, 3),
                    "gap_s": None if f.gap_s is None else round(f.gap_s, 3),
                    "down_s": None if f.down_s is None else round(f.down_s, 3),
                    "refused": list(f.refused),
                    "restarted": f.restarted,
                }
                for f in self.injected
            ],
            "refusals": [{"role": r.role, "pid": r.pid, "revoked": r.what, "line": r.line} for r in self.refusals],
            "failures": [{"role": f.role, "pid": f.pid, "code": f.code, "log_tail": f.log_tail} for f in self.failures],
            "stuck_restarts": self.stuck_restarts,
            "unreachable_restarts": self.unreachable_restarts,
            "errors_logged": self.errors_logged,
            "audit": None
            if self.audit is None
            else {
                "ok": self.audit.ok,
                "steps": self.audit.steps,
                "samples": self.audit.samples,
                "expected": self.audit.expected,
                "sink_micro_batches": self.audit.sink_micro_batches,
                "dead_letters": self.audit.dead_letters,
                "problems": self.audit.problems,
            },
        }
        return json.dumps(body, indent=1)


def _refusal_line(refusals: list[Refusal]) -> str:
    by_role = Counter(r.role for r in refusals)
    counted = ", ".join(f"{role} {n}" for role, n in sorted(by_role.items())) or "none"
    return (
        f"roles stopped by revoked rights (exit 5 naming the refusal; started again once the rights were back): "
        f"{len(refusals)} ({counted})"
    )


def _storage_key_line(injected: list[InjectedFault]) -> list[str]:
    revoked = [f for f in injected if f.fault.kind is FaultKind.REVOKE_STORAGE_KEY]
    if not revoked:
        return []
    reading = sum(f.restarted is None for f in revoked)
    return [
        f"revoke-storage-key: {len(revoked)} revocations; a loader reading the store refused in {reading}, in the "
        f"other {len(revoked) - reading} no loader read it and one restarted meanwhile was refused at its start"
    ]


def _each_kind(refusals: list[Refusal]) -> list[Refusal]:
    """One refusal of each role kind and revocation kind (a loader refused its ACLs, its storage key, ...)."""
    first: dict[tuple[str, str], Refusal] = {}
    for refusal in refusals:
        first.setdefault((refusal.role.rstrip("0123456789"), refusal.what.startswith("the ACLs")), refusal)
    return list(first.values())


def _gap_line(gaps: list[float]) -> str:
    if not gaps:
        return "takeover gaps: no active constructor was killed"
    return (
        f"takeover gaps (kill of the active constructor to the next step written): median "
        f"{statistics.median(gaps):.2f} s, worst {max(gaps):.2f} s, over {len(gaps)} kills"
    )
