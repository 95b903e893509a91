"""A chaos run's faults, drawn from a seed: which kind comes n-th, which role it strikes, and how long the
run pauses before it. The same seed and targets give the same schedule. Pure: no processes, no Kafka."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class FaultKind(StrEnum):
    KILL_LOADER = "kill-loader"
    KILL_ACTIVE_CONSTRUCTOR = "kill-active-constructor"
    KILL_SHADOW_CONSTRUCTOR = "kill-shadow-constructor"
    KILL_SINK = "kill-sink"
    RESTART_BROKER = "restart-broker"


DEFAULT_WEIGHTS: Mapping[FaultKind, float] = {
    FaultKind.KILL_LOADER: 3,
    FaultKind.KILL_ACTIVE_CONSTRUCTOR: 3,
    FaultKind.KILL_SHADOW_CONSTRUCTOR: 1,
    FaultKind.KILL_SINK: 2,
    FaultKind.RESTART_BROKER: 1,
}


@dataclass(frozen=True)
class Targets:
    """What a run can strike: its loader and sink roles by name, its shadow constructors, its broker."""

    loaders: tuple[str, ...]
    sinks: tuple[str, ...]
    shadows: int
    broker: bool

    def kinds(self) -> list[FaultKind]:
        present = {
            FaultKind.KILL_LOADER: bool(self.loaders),
            FaultKind.KILL_ACTIVE_CONSTRUCTOR: True,
            FaultKind.KILL_SHADOW_CONSTRUCTOR: self.shadows > 0,
            FaultKind.KILL_SINK: bool(self.sinks),
            FaultKind.RESTART_BROKER: self.broker,
        }
        return [kind for kind in FaultKind if present[kind]]


@dataclass(frozen=True)
class Fault:
    number: int  # from 1
    kind: FaultKind
    target: str | None  # the loader or sink role killed; the run finds the constructor, and there is one broker
    pause_s: float  # how long the run waits, once the previous fault is survived, before this one
    down_s: float = 0.0  # how long a restarted broker stays down

    def describe(self) -> str:
        where = f" {self.target}" if self.target else ""
        down = f", down {self.down_s:.1f} s" if self.kind is FaultKind.RESTART_BROKER else ""
        return f"fault {self.number} {self.kind}{where}{down}"


def plan_faults(
    seed: int,
    count: int,
    targets: Targets,
    weights: Mapping[FaultKind, float] = DEFAULT_WEIGHTS,
    max_pause_s: float = 2.0,
    max_down_s: float = 3.0,
) -> tuple[Fault, ...]:
    """``count`` faults of the kinds ``targets`` allows: each kind at least once when ``count`` is large
    enough, the rest drawn by ``weights``, in a shuffled order."""
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
        pause = round(rng.uniform(0, max_pause_s), 3)
        down = round(rng.uniform(0, max_down_s), 3) if kind is FaultKind.RESTART_BROKER else 0.0
        faults.append(Fault(number, kind, target, pause, down))
    return tuple(faults)


def count_kinds(faults: tuple[Fault, ...] | list[Fault]) -> Counter[FaultKind]:
    return Counter(f.kind for f in faults)
