"""A chaos run's faults, drawn from a seed: which kind comes n-th, which role it strikes, and how long the
run pauses before it. The same seed and targets give the same schedule. Pure: no processes, no Kafka."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum


class FaultKind(StrEnum):
    KILL_LOADER = "kill-loader"
    KILL_ACTIVE_CONSTRUCTOR = "kill-active-constructor"
    KILL_SHADOW_CONSTRUCTOR = "kill-shadow-constructor"
    KILL_SINK = "kill-sink"
    RESTART_BROKER = "restart-broker"
    RESTART_OBJECT_STORE = "restart-object-store"
    STALL_OBJECT_STORE = "stall-object-store"  # SIGSTOP, then SIGCONT: requests hang meanwhile
    SLOW_OBJECT_STORE = "slow-object-store"  # the run's proxy holds every chunk a while
    REFUSE_OBJECT_STORE = "refuse-object-store"  # the run's proxy resets open connections and new ones
    REVOKE_ACLS = "revoke-acls"  # a role's Kafka ACL bindings deleted a while, then created again
    # The loaders' object store user removed a while, then added again; a loader is restarted meanwhile when none
    # read the store (an idle loader reads nothing).
    REVOKE_STORAGE_KEY = "revoke-storage-key"


OBJECT_STORE_KINDS = frozenset(
    {
        FaultKind.RESTART_OBJECT_STORE,
        FaultKind.STALL_OBJECT_STORE,
        FaultKind.SLOW_OBJECT_STORE,
        FaultKind.REFUSE_OBJECT_STORE,
    }
)
# The object store faults that last a while (1 s up to max_stall_s) rather than a restart's time down.
LASTING_KINDS = OBJECT_STORE_KINDS - {FaultKind.RESTART_OBJECT_STORE}
# The faults that take a role's rights away a while (1 s up to max_revoke_s, and until the roles it strikes have
# stopped with the refusal); the roles are started again once the rights are back.
ACCESS_KINDS = frozenset({FaultKind.REVOKE_ACLS, FaultKind.REVOKE_STORAGE_KEY})


DEFAULT_WEIGHTS: Mapping[FaultKind, float] = {
    FaultKind.KILL_LOADER: 3,
    FaultKind.KILL_ACTIVE_CONSTRUCTOR: 3,
    FaultKind.KILL_SHADOW_CONSTRUCTOR: 1,
    FaultKind.KILL_SINK: 2,
    FaultKind.RESTART_BROKER: 1,
    FaultKind.RESTART_OBJECT_STORE: 1,
    FaultKind.STALL_OBJECT_STORE: 1,
    FaultKind.SLOW_OBJECT_STORE: 1,
    FaultKind.REFUSE_OBJECT_STORE: 1,
    FaultKind.REVOKE_ACLS: 2,
    FaultKind.REVOKE_STORAGE_KEY: 1,
}


@dataclass(frozen=True)
class Targets:
    """What a run can strike: its loader and sink roles by name, its shadow constructors, its broker, the
    object store its sources are read from, the ``kafka.principals`` keys whose ACLs a secured run can revoke
    (a loader's ``loader.<source>``, ``constructor``, ``trainer``), and the loaders that read ``s3://`` sources in
    that store with a key the run can revoke."""

    loaders: tuple[str, ...]
    sinks: tuple[str, ...]
    shadows: int
    broker: bool
    object_store: bool = False
    principals: tuple[str, ...] = ()
    storage_loaders: tuple[str, ...] = ()

    def kinds(self) -> list[FaultKind]:
        return [kind for kind in FaultKind if self._wanting(kind) is None]

    def missing(self, kinds: Iterable[FaultKind]) -> list[str]:
        """For each of ``kinds`` the run has no target for, ``"<kind> needs <what gives it one>"``."""
        return [f"{kind} needs {wanting}" for kind in kinds if (wanting := self._wanting(kind)) is not None]

    def _wanting(self, kind: FaultKind) -> str | None:
        """What the run lacks to strike with ``kind``: None when it has a target."""
        if kind in OBJECT_STORE_KINDS:
            return None if self.object_store else "an object store (--object-store-dir) that the spec's sources read"
        if kind is FaultKind.REVOKE_ACLS:
            return None if self.principals else "a secured run (--secure), a principal and ACLs per role"
        if kind is FaultKind.REVOKE_STORAGE_KEY:
            wanting = "an object store (--object-store-dir) that the spec's s3:// sources are read from"
            return None if self.storage_loaders else wanting
        shadow = "a shadow constructor (--shadows 1 or more)"
        wanting = {
            FaultKind.KILL_LOADER: None if self.loaders else "a loader",
            FaultKind.KILL_ACTIVE_CONSTRUCTOR: None,
            FaultKind.KILL_SHADOW_CONSTRUCTOR: None if self.shadows > 0 else shadow,
            FaultKind.KILL_SINK: None if self.sinks else "a sink",
            FaultKind.RESTART_BROKER: None if self.broker else "the run's own broker (no --bootstrap-servers)",
        }
        return wanting[kind]


@dataclass(frozen=True)
class Fault:
    number: int  # from 1
    kind: FaultKind
    # The loader or sink role killed, the principal key whose ACLs are revoked, or the loader restarted while the
    # storage key is revoked if none read the store; the run finds the constructor; one broker, one store.
    target: str | None
    pause_s: float  # how long the run waits, once the previous fault is survived, before this one
    # How long a restarted broker or object store stays down, a stalled store stalls, or rights stay revoked.
    down_s: float = 0.0

    def describe(self) -> str:
        where = f" {self.target}" if self.target and self.kind is not FaultKind.REVOKE_STORAGE_KEY else ""
        down = ""
        if self.kind in (FaultKind.RESTART_BROKER, FaultKind.RESTART_OBJECT_STORE):
            down = f", down {self.down_s:.1f} s"
        elif self.kind in LASTING_KINDS:
            down = f", for {self.down_s:.1f} s"
        elif self.kind is FaultKind.REVOKE_STORAGE_KEY:
            down = f", for {self.down_s:.1f} s at least, then {self.target} restarted if no loader read the store"
        elif self.kind in ACCESS_KINDS:
            down = f", for {self.down_s:.1f} s at least"
        return f"fault {self.number} {self.kind}{where}{down}"


def plan_faults(
    seed: int,
    count: int,
    targets: Targets,
    weights: Mapping[FaultKind, float] = DEFAULT_WEIGHTS,
    max_pause_s: float = 2.0,
    max_down_s: float = 3.0,
    max_stall_s: float = 5.0,
    max_revoke_s: float = 5.0,
) -> tuple[Fault, ...]:
    """``count`` faults of the kinds ``targets`` allows: each kind at least once when ``count`` is large
    enough, the rest drawn by ``weights``, in a shuffled order. A restart is down up to ``max_down_s``; an
    object store that is stalled, slow or refusing is so from 1 s to ``max_stall_s``; rights are revoked from
    1 s to ``max_revoke_s`` (and until the roles struck stop)."""
    if count < 0:
        msg = f"the number of faults must not be negative, not {count}"
        raise ValueError(msg)
    rng = random.Random(seed)
    kinds = [kind for kind in targets.kinds() if weights.get(kind, 0) > 0]
    if not kinds:
        msg = "no kind of fault has both a target and a weight above 0"
        raise ValueError(msg)
    drawn = kinds if count >= len(kinds) else rng.sample(kinds, count)
    drawn = drawn + rng.choices(kinds, weights=[weights[k] for k in kinds], k=count - len(drawn))
    rng.shuffle(drawn)
    faults = []
    for number, kind in enumerate(drawn, start=1):
        target = None
        if kind is FaultKind.KILL_LOADER:
            target = rng.choice(targets.loaders)
        elif kind is FaultKind.KILL_SINK:
            target = rng.choice(targets.sinks)
        elif kind is FaultKind.REVOKE_ACLS:
            target = rng.choice(targets.principals)
        elif kind is FaultKind.REVOKE_STORAGE_KEY:
            target = rng.choice(targets.storage_loaders)
        pause = round(rng.uniform(0, max_pause_s), 3)
        down = _down_s(rng, kind, max_down_s, max_stall_s, max_revoke_s)
        faults.append(Fault(number, kind, target, pause, down))
    return tuple(faults)


def _down_s(rng: random.Random, kind: FaultKind, max_down_s: float, max_stall_s: float, max_revoke_s: float) -> float:
    """How long the fault keeps its target away; drawn only for the kinds that have one, so that a schedule
    without them draws the same faults from a seed whatever other kinds exist."""
    if kind in (FaultKind.RESTART_BROKER, FaultKind.RESTART_OBJECT_STORE):
        return round(rng.uniform(0, max_down_s), 3)
    if kind in LASTING_KINDS:
        return round(rng.uniform(min(1.0, max_stall_s), max_stall_s), 3)
    if kind in ACCESS_KINDS:
        return round(rng.uniform(min(1.0, max_revoke_s), max_revoke_s), 3)
    return 0.0


def count_kinds(faults: tuple[Fault, ...] | list[Fault]) -> Counter[FaultKind]:
    return Counter(f.kind for f in faults)
